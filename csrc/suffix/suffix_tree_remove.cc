// SuffixTree: removing sequences, and rebuilding to release memory.
#include <algorithm>
#include <cassert>
#include <utility>

#include "suffix_tree.h"

namespace sse {

namespace {
// Rebuild once pinned tokens or free node slots clearly dominate.
constexpr int64_t kPinnedSlack = 1 << 16;
constexpr size_t kFreeNodeSlack = 1 << 16;
}  // namespace

void SuffixTree::merge_into_child(int32_t x) {
  Node& xn = nodes_[x];
  const int32_t c = xn.children[0].id;
  Node& cn = nodes_[c];
  const int32_t p = xn.parent;
  cn.token = xn.token;
  cn.length += xn.length;
  cn.ref_idx -= xn.length;  // c's reference holds its whole path string
  cn.parent = p;
  cn.slot = xn.slot;
  set_child(p, xn.slot, xn.token, c);
  free_node(x);
}

void SuffixTree::remove_string(const int32_t* s, int len) {
  path_.clear();
  int32_t node = 0;
  int consumed = 0;
  while (consumed < len) {
    node = child(node, s[consumed]);
    assert(node > 0);
    consumed += nodes_[node].length;
    path_.push_back(node);
  }
  assert(consumed == len);
  nodes_[0].count -= 1;
  if (path_.empty()) return;
  nodes_[node].endings -= 1;
  int32_t lowest_alive = 0;
  for (int i = static_cast<int>(path_.size()) - 1; i >= 0; --i) {
    const int32_t n = path_[i];
    dec_count(n);
    if (nodes_[n].count > 0) {
      if (lowest_alive == 0) lowest_alive = n;
      continue;
    }
    // Count zero: its children are gone and dec_count moved it last.
    const int32_t p = nodes_[n].parent;
    assert(nodes_[p].children.back().id == n);
    pop_child(p);
    free_node(n);
  }
  if (lowest_alive != 0) {
    const Node& low = nodes_[lowest_alive];
    if (low.endings == 0 && low.children.size() == 1) merge_into_child(lowest_alive);
  }
}

void SuffixTree::remove_sequence(int sid) {
  Seq& s = seqs_[sid];
  const int n = static_cast<int>(s.tokens.size());
  const int32_t* toks = s.tokens.data();
  for (int i = 0; i < n; ++i) remove_string(toks + i, std::min(max_depth_, n - i));
  std::vector<int32_t>().swap(s.active);
  s.live = false;
  --num_live_;
  live_tokens_ -= n;
  if (s.refs == 0) {
    std::vector<int32_t>().swap(s.tokens);
    s.used = false;
    free_seqs_.push_back(sid);
  } else {
    pinned_tokens_ += n;
  }
  maybe_compact();
}

void SuffixTree::maybe_compact() {
  const bool pinned_heavy = pinned_tokens_ > live_tokens_ / 2 + kPinnedSlack;
  const bool sparse = free_.size() > kFreeNodeSlack && free_.size() * 2 > nodes_.size();
  if (pinned_heavy || sparse) rebuild();
}

// Re-inserts the live sequences into a fresh tree (same ids, same counts);
// pinned tokens and free node slots are released.
void SuffixTree::rebuild() {
  std::vector<Seq> old;
  old.swap(seqs_);
  std::vector<Node>().swap(nodes_);
  nodes_.emplace_back();
  std::vector<int32_t>().swap(free_);
  index_.clear();
  seqs_.resize(old.size());
  free_seqs_.clear();
  live_tokens_ = 0;
  pinned_tokens_ = 0;
  for (int sid = static_cast<int>(old.size()) - 1; sid >= 0; --sid) {
    if (!old[sid].live) {
      free_seqs_.push_back(sid);
      continue;
    }
    Seq& s = seqs_[sid];
    s.live = true;
    s.used = true;
    s.active.assign(1, 0);
    const std::vector<int32_t> toks = std::move(old[sid].tokens);
    s.tokens.reserve(toks.size());
    for (const int32_t t : toks) append(sid, t);
    if (old[sid].active.empty()) finish_sequence(sid);
  }
}

}  // namespace sse
