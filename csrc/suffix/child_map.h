// Child lookup for the suffix tree: one flat open-addressing hash table per
// tree, keyed by (parent node id, first token of the child's edge).
//
// Linear probing over a power-of-two table with Fibonacci hashing; deletion by
// backward shifting, so there are no tombstones and lookups stay short after
// many removals. The table shrinks when it becomes sparse, so memory follows
// the tree size down as well as up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sse {

class ChildMap {
 public:
  ChildMap() { reset(kMinCapacity); }

  static uint64_t key(int32_t node, int32_t token) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) |
           static_cast<uint32_t>(token);
  }

  // Value stored under `k`, or -1.
  int32_t find(uint64_t k) const {
    size_t i = home(k);
    while (true) {
      const uint64_t cur = keys_[i];
      if (cur == k) return vals_[i];
      if (cur == kEmpty) return -1;
      i = (i + 1) & mask_;
    }
  }

  // Inserts or overwrites.
  void put(uint64_t k, int32_t v) {
    if ((size_ + 1) * 4 > keys_.size() * 3) rehash(keys_.size() * 2);
    size_t i = home(k);
    while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & mask_;
    if (keys_[i] == kEmpty) ++size_;
    keys_[i] = k;
    vals_[i] = v;
  }

  void erase(uint64_t k) {
    size_t i = home(k);
    while (keys_[i] != k) {
      if (keys_[i] == kEmpty) return;
      i = (i + 1) & mask_;
    }
    // Backward shift: pull later members of the probe run into the hole when
    // the hole lies between their home slot and their current slot.
    size_t j = i;
    while (true) {
      j = (j + 1) & mask_;
      const uint64_t cur = keys_[j];
      if (cur == kEmpty) break;
      const size_t h = home(cur);
      if (((j - h) & mask_) >= ((j - i) & mask_)) {
        keys_[i] = cur;
        vals_[i] = vals_[j];
        i = j;
      }
    }
    keys_[i] = kEmpty;
    --size_;
    if (keys_.size() > kMinCapacity && size_ * 8 < keys_.size()) rehash(keys_.size() / 2);
  }

  size_t size() const { return size_; }
  size_t memory_bytes() const { return keys_.capacity() * (sizeof(uint64_t) + sizeof(int32_t)); }
  void clear() { reset(kMinCapacity); }

 private:
  static constexpr uint64_t kEmpty = ~static_cast<uint64_t>(0);  // never a valid key
  static constexpr size_t kMinCapacity = 16;

  size_t home(uint64_t k) const {
    return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void reset(size_t capacity) {
    keys_.assign(capacity, kEmpty);
    keys_.shrink_to_fit();
    vals_.assign(capacity, -1);
    vals_.shrink_to_fit();
    mask_ = capacity - 1;
    shift_ = 64;
    for (size_t c = capacity; c > 1; c >>= 1) --shift_;
    size_ = 0;
  }

  void rehash(size_t capacity) {
    std::vector<uint64_t> old_keys;
    std::vector<int32_t> old_vals;
    old_keys.swap(keys_);
    old_vals.swap(vals_);
    reset(capacity);
    for (size_t i = 0; i < old_keys.size(); ++i) {
      if (old_keys[i] == kEmpty) continue;
      size_t s = home(old_keys[i]);
      while (keys_[s] != kEmpty) s = (s + 1) & mask_;
      keys_[s] = old_keys[i];
      vals_[s] = old_vals[i];
      ++size_;
    }
  }

  std::vector<uint64_t> keys_;
  std::vector<int32_t> vals_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

}  // namespace sse
