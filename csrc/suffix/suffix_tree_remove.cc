// SuffixTree: removing sequences and trimming windows; rebuild (tests only).
#include <algorithm>
#include <cassert>
#include <utility>

#include "suffix_tree.h"

namespace sse {

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
  touched_.push_back(c);  // c may refer to the sequence being removed
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
      touched_.push_back(n);
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
  const int64_t first = seqs_[sid].first;
  const int n = static_cast<int>(seqs_[sid].tokens.size());
  const int32_t* toks = seqs_[sid].tokens.data();
  touched_.clear();
  for (int i = static_cast<int>(first); i < n; ++i) {
    remove_string(toks + i, std::min(max_depth_, n - i));
  }
  Seq& s = seqs_[sid];
  std::vector<int32_t>().swap(s.active);
  s.live = false;
  --num_live_;
  live_tokens_ -= n - first;
  if (s.refs == 0) {
    std::vector<int32_t>().swap(s.tokens);
    s.used = false;
    free_seqs_.push_back(sid);
  } else {
    pinned_tokens_ += n;
    repoint_refs(sid);
  }
  touched_.clear();
}

// Surviving nodes that still refer to the removed sequence `sid` (all of them
// lie on the paths just walked, or were merged into: touched_) take another
// reference, deepest first: a child's occurrence spells the parent's path
// string too. The path strings of the others (intervals of `sid`) are merged
// into spans and copied into one fragment sequence, unless that would not be
// smaller than `sid` itself, which then stays pinned whole. `sid`'s tokens are
// released when no node refers to them any more.
void SuffixTree::repoint_refs(int sid) {
  std::sort(touched_.begin(), touched_.end(), [this](int32_t a, int32_t b) {
    return nodes_[a].depth != nodes_[b].depth ? nodes_[a].depth > nodes_[b].depth : a < b;
  });
  touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
  struct Left {
    int32_t start;  // the node's path string is sid[start : start + depth]
    int32_t node;
  };
  std::vector<Left> left;
  for (const int32_t x : touched_) {
    if (nodes_[x].ref_seq != sid || nodes_[x].count <= 0) continue;
    const Node& xn = nodes_[x];
    int32_t donor = -1;
    for (const Child& e : xn.children) {
      if (nodes_[e.id].ref_seq != sid) {
        donor = e.id;
        break;
      }
    }
    if (donor >= 0) {
      set_ref(x, nodes_[donor].ref_seq, nodes_[donor].ref_idx - xn.length);
    } else {
      left.push_back(Left{xn.ref_idx + xn.length - xn.depth, x});
    }
    if (seqs_[sid].refs == 0) return;  // released
  }
  if (left.empty()) return;
  std::sort(left.begin(), left.end(), [](const Left& a, const Left& b) { return a.start < b.start; });
  // Spans: merged intervals, and where each starts in the fragment.
  std::vector<int32_t> frag_tokens;
  std::vector<std::pair<int32_t, int32_t>> place;  // per entry of `left`: fragment offset of start
  place.reserve(left.size());
  const std::vector<int32_t>& src = seqs_[sid].tokens;
  int32_t span_start = -1, span_end = -1, span_at = 0;
  for (const Left& l : left) {
    const int32_t end = l.start + nodes_[l.node].depth;
    if (span_start < 0 || l.start > span_end) {
      if (span_start >= 0) frag_tokens.insert(frag_tokens.end(), src.begin() + span_start, src.begin() + span_end);
      span_start = l.start;
      span_end = end;
      span_at = static_cast<int32_t>(frag_tokens.size());
    } else if (end > span_end) {
      span_end = end;
    }
    place.emplace_back(l.node, span_at + (l.start - span_start));
  }
  frag_tokens.insert(frag_tokens.end(), src.begin() + span_start, src.begin() + span_end);
  if (frag_tokens.size() >= src.size()) return;  // keep `sid` pinned instead
  int frag;
  if (!free_seqs_.empty()) {
    frag = free_seqs_.back();
    free_seqs_.pop_back();
  } else {
    frag = static_cast<int>(seqs_.size());
    seqs_.emplace_back();
  }
  Seq& f = seqs_[frag];
  f.tokens = std::move(frag_tokens);
  f.active.clear();
  f.first = 0;
  f.refs = 0;
  f.live = false;
  f.used = true;
  pinned_tokens_ += static_cast<int64_t>(f.tokens.size());
  for (const auto& [x, at] : place) {
    const Node& xn = nodes_[x];
    set_ref(x, frag, at + xn.depth - xn.length);
  }
}

void SuffixTree::trim_front(int sid, int64_t first) {
  Seq& s = seqs_[sid];
  assert(s.live && first <= static_cast<int64_t>(s.tokens.size()) - max_depth_);
  for (int64_t i = s.first; i < first; ++i) remove_string(s.tokens.data() + i, max_depth_);
  touched_.clear();
  if (first > s.first) {
    live_tokens_ -= first - s.first;
    s.first = first;
  }
}

// Re-inserts the live sequences into a fresh tree (same ids, same counts);
// pinned tokens and free node slots are released.
void SuffixTree::rebuild() {
  std::vector<Seq> old;
  old.swap(seqs_);
  std::vector<Node>().swap(nodes_);
  nodes_.emplace_back();
  std::vector<int32_t>().swap(free_);
  child_bytes_ = 0;
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
    s.tokens.reserve(toks.size() - old[sid].first);
    for (size_t i = old[sid].first; i < toks.size(); ++i) append(sid, toks[i]);
    if (old[sid].active.empty()) finish_sequence(sid);
  }
}

}  // namespace sse
