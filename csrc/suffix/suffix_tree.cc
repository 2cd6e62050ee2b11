// SuffixTree: construction, queries and insertion (removal in suffix_tree_remove.cc).
#include "suffix_tree.h"

#include <algorithm>
#include <cassert>

namespace sse {

SuffixTree::SuffixTree(int max_depth) : max_depth_(max_depth) { nodes_.emplace_back(); }

int SuffixTree::add_sequence() {
  int sid;
  if (!free_seqs_.empty()) {
    sid = free_seqs_.back();
    free_seqs_.pop_back();
  } else {
    sid = static_cast<int>(seqs_.size());
    seqs_.emplace_back();
  }
  Seq& s = seqs_[sid];
  s.tokens.clear();
  s.active.assign(1, 0);
  s.first = 0;
  s.refs = 0;
  s.live = true;
  s.used = true;
  ++num_live_;
  return sid;
}

void SuffixTree::extend(int sid, const int32_t* tokens, size_t n) {
  for (size_t i = 0; i < n; ++i) append(sid, tokens[i]);
}

void SuffixTree::finish_sequence(int sid) {
  std::vector<int32_t>().swap(seqs_[sid].active);
}

int SuffixTree::tracked(int sid) const {
  const Seq& s = seqs_[sid];
  return s.active.empty() ? 0 : static_cast<int>(s.active.size()) - 1;
}

Pos SuffixTree::tracked_pos(int sid, int m) const {
  const int32_t n = seqs_[sid].active[m];
  return Pos{n, nodes_[n].length};
}

Pos SuffixTree::walk(const int32_t* s, int m) const {
  int32_t node = 0;
  int32_t off = 0;
  for (int i = 0; i < m; ++i) {
    const Node& n = nodes_[node];
    if (off == n.length) {
      const int32_t c = child(node, s[i]);
      if (c < 0) return Pos{-1, 0};
      node = c;
      off = 1;
    } else {
      if (token_at(n, off) != s[i]) return Pos{-1, 0};
      ++off;
    }
  }
  return Pos{node, off};
}

void SuffixTree::next_tokens(Pos p, double prob, double min_prob, int limit,
                             std::vector<Next>& out) const {
  out.clear();
  if (limit <= 0) return;
  const Node& n = nodes_[p.node];
  if (p.off < n.length) {  // inside an edge: one continuation, taken by every occurrence
    if (prob >= min_prob) out.push_back(Next{token_at(n, p.off), n.count, prob, Pos{p.node, p.off + 1}});
    return;
  }
  const int32_t cont = n.count - n.endings;  // occurrences followed by some token
  if (cont <= 0) return;
  for (const Child& entry : n.children) {
    const int32_t c = entry.id;
    const Node& ch = nodes_[c];
    // Children come by count, descending; past the limit only ties still matter.
    if (static_cast<int>(out.size()) >= limit && ch.count < out[limit - 1].count) break;
    const double q = ch.count == cont ? prob : prob * ch.count / cont;
    if (q < min_prob) break;
    out.push_back(Next{ch.token, ch.count, q, Pos{c, 1}});
  }
  if (out.size() > 1) {
    std::sort(out.begin(), out.end(), [](const Next& a, const Next& b) {
      return a.count != b.count ? a.count > b.count : a.token < b.token;
    });
  }
  if (static_cast<int>(out.size()) > limit) out.resize(limit);
}

int64_t SuffixTree::memory_bytes() const {
  // Node slots in use or free (the high-water mark); reserved address space
  // beyond it is never touched and holds no memory.
  int64_t total = static_cast<int64_t>(nodes_.size() * sizeof(Node) +
                                       free_.capacity() * sizeof(int32_t));
  total += child_bytes_;
  total += static_cast<int64_t>(index_.memory_bytes());
  total += static_cast<int64_t>(seqs_.capacity() * sizeof(Seq));
  for (const Seq& s : seqs_) {
    total += static_cast<int64_t>((s.tokens.capacity() + s.active.capacity()) * sizeof(int32_t));
  }
  return total;
}

namespace {
// Heap bytes of a child array of `cap` entries: glibc malloc rounds a request
// plus its 8-byte header up to 16 bytes, with a 32-byte minimum chunk.
int64_t child_alloc_bytes(size_t cap) {
  if (cap == 0) return 0;
  const size_t raw = (cap * sizeof(Child) + 8 + 15) & ~static_cast<size_t>(15);
  return static_cast<int64_t>(raw < 32 ? 32 : raw);
}
}  // namespace

void SuffixTree::account_children(size_t old_cap, size_t new_cap) {
  if (old_cap != new_cap) child_bytes_ += child_alloc_bytes(new_cap) - child_alloc_bytes(old_cap);
}

void SuffixTree::push_child(int32_t parent, Child c) {
  std::vector<Child>& ch = nodes_[parent].children;
  const size_t cap = ch.capacity();
  ch.push_back(c);
  account_children(cap, ch.capacity());
}

// ---------------------------------------------------------------- insertion

void SuffixTree::append(int sid, int32_t token) {
  Seq& s = seqs_[sid];
  assert(!s.active.empty() && s.live);
  s.tokens.push_back(token);
  const int32_t end = static_cast<int32_t>(s.tokens.size());
  ++live_tokens_;
  nodes_[0].count += 1;  // the new empty string at the root
  std::vector<int32_t>& act = s.active;
  const int k = static_cast<int>(act.size()) - 1;
  const int top = std::min(k, max_depth_ - 1);
  if (top + 2 > static_cast<int>(act.size())) act.push_back(0);
  // Longest first, so act[j] is read before act[j] is overwritten.
  for (int j = top; j >= 0; --j) act[j + 1] = step(act[j], token, sid, end);
}

// The string of sequence `sid` ending at node x (at the end of x's edge) grows by
// token t, which sits at index end-1 of the sequence. Returns its new node.
int32_t SuffixTree::step(int32_t x, int32_t t, int sid, int32_t end) {
  const bool at_root = (x == 0);
  const int32_t c = child(x, t);
  if (c < 0) {
    Node& xn = nodes_[x];
    if (!at_root && xn.endings == 1 && xn.children.empty()) {
      // x's only occurrence is this string: its edge grows in place.
      xn.length += 1;
      xn.depth += 1;
      set_ref(x, sid, end - xn.length);
      return x;
    }
    if (!at_root) xn.endings -= 1;
    const int32_t n = new_node(x, t, 1, sid, end - 1);
    nodes_[n].endings = 1;
    add_child(x, n);
    return n;
  }
  Node& xn = nodes_[x];
  Node& cn = nodes_[c];
  if (!at_root && xn.endings == 1 && xn.children.size() == 1) {
    // After the move x has no ending and a single child: the two fuse.
    if (cn.length == 1) {  // c takes x's place
      const int32_t p = xn.parent;
      cn.count += 1;
      cn.endings += 1;
      cn.token = xn.token;
      cn.length = xn.length + 1;
      cn.parent = p;
      cn.slot = xn.slot;
      set_child(p, xn.slot, xn.token, c);
      set_ref(c, sid, end - cn.length);
      free_node(x);
      return c;
    }
    // x absorbs the first token of c's edge.
    cn.ref_idx += 1;
    cn.length -= 1;
    cn.token = token_at(cn, 0);
    set_child(x, 0, cn.token, c);
    xn.length += 1;
    xn.depth += 1;
    set_ref(x, sid, end - xn.length);
    return x;
  }
  if (!at_root) xn.endings -= 1;
  if (cn.length == 1) {
    inc_count(c);
    nodes_[c].endings += 1;
    set_ref(c, sid, end - 1);
    return c;
  }
  // Split c after its first token; the upper part u takes c's slot.
  const int32_t u = new_node(x, t, nodes_[c].count, sid, end - 1);
  Node& un = nodes_[u];
  Node& lower = nodes_[c];
  un.endings = 1;
  un.slot = lower.slot;
  lower.parent = u;
  lower.slot = 0;
  lower.ref_idx += 1;
  lower.length -= 1;
  lower.token = token_at(lower, 0);
  push_child(u, Child{lower.token, c});
  set_child(x, un.slot, t, u);
  inc_count(u);
  return u;
}

int32_t SuffixTree::new_node(int32_t parent, int32_t token, int32_t count, int sid,
                             int32_t ref_idx) {
  int32_t n;
  if (!free_.empty()) {
    n = free_.back();
    free_.pop_back();
  } else {
    n = static_cast<int32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& nn = nodes_[n];
  nn.count = count;
  nn.endings = 0;
  nn.token = token;
  nn.length = 1;
  nn.depth = nodes_[parent].depth + 1;
  nn.parent = parent;
  nn.slot = 0;
  nn.ref_seq = sid;
  nn.ref_idx = ref_idx;
  seqs_[sid].refs += 1;
  return n;
}

void SuffixTree::free_node(int32_t n) {
  Node& nn = nodes_[n];
  const int sid = nn.ref_seq;
  nn.ref_seq = -1;
  nn.count = 0;
  nn.endings = 0;
  nn.parent = -1;
  assert(!nn.indexed);
  account_children(nn.children.capacity(), 0);
  std::vector<Child>().swap(nn.children);
  free_.push_back(n);
  release_ref(sid);
}

void SuffixTree::set_ref(int32_t n, int sid, int32_t ref_idx) {
  Node& nn = nodes_[n];
  nn.ref_idx = ref_idx;
  if (nn.ref_seq == sid) return;
  const int old = nn.ref_seq;
  nn.ref_seq = sid;
  seqs_[sid].refs += 1;
  release_ref(old);
}

void SuffixTree::release_ref(int sid) {
  Seq& s = seqs_[sid];
  if (--s.refs > 0 || s.live) return;
  pinned_tokens_ -= static_cast<int64_t>(s.tokens.size());
  std::vector<int32_t>().swap(s.tokens);
  s.used = false;
  free_seqs_.push_back(sid);
}

void SuffixTree::add_child(int32_t parent, int32_t c) {
  // A new child has count 1, the smallest, so it goes last.
  Node& pn = nodes_[parent];
  const int32_t token = nodes_[c].token;
  nodes_[c].slot = static_cast<int32_t>(pn.children.size());
  push_child(parent, Child{token, c});
  if (pn.indexed) {
    index_.put(ChildMap::key(parent, token), c);
  } else if (pn.children.size() > kIndexAbove) {
    for (const Child& e : pn.children) index_.put(ChildMap::key(parent, e.token), e.id);
    pn.indexed = true;
  }
}

// Puts child c (first token `token`) at `slot` of parent, replacing the entry there.
void SuffixTree::set_child(int32_t parent, int32_t slot, int32_t token, int32_t c) {
  Node& pn = nodes_[parent];
  Child& e = pn.children[slot];
  if (pn.indexed) {
    if (e.token != token) index_.erase(ChildMap::key(parent, e.token));
    index_.put(ChildMap::key(parent, token), c);
  }
  e.token = token;
  e.id = c;
}

void SuffixTree::pop_child(int32_t parent) {
  Node& pn = nodes_[parent];
  if (pn.indexed) {
    index_.erase(ChildMap::key(parent, pn.children.back().token));
    if (pn.children.size() - 1 < kUnindexBelow) {
      for (size_t i = 0; i + 1 < pn.children.size(); ++i) {
        index_.erase(ChildMap::key(parent, pn.children[i].token));
      }
      pn.indexed = false;
    }
  }
  pn.children.pop_back();
}

// Counts change by one; swapping with the first (last) sibling of equal count
// keeps the children sorted by count in O(log siblings).
void SuffixTree::inc_count(int32_t n) {
  Node& nn = nodes_[n];
  const int32_t k = nn.count;
  std::vector<Child>& ch = nodes_[nn.parent].children;
  const int32_t i = nn.slot;
  if (i > 0 && nodes_[ch[i - 1].id].count == k) {
    int32_t lo = 0;
    int32_t hi = i - 1;
    while (lo < hi) {
      const int32_t mid = (lo + hi) / 2;
      if (nodes_[ch[mid].id].count > k) lo = mid + 1; else hi = mid;
    }
    std::swap(ch[lo], ch[i]);
    nodes_[ch[i].id].slot = i;
    nn.slot = lo;
  }
  nn.count = k + 1;
}

void SuffixTree::dec_count(int32_t n) {
  Node& nn = nodes_[n];
  const int32_t k = nn.count;
  std::vector<Child>& ch = nodes_[nn.parent].children;
  const int32_t i = nn.slot;
  const int32_t last = static_cast<int32_t>(ch.size()) - 1;
  if (i < last && nodes_[ch[i + 1].id].count == k) {
    int32_t lo = i + 1;
    int32_t hi = last;
    while (lo < hi) {
      const int32_t mid = (lo + hi + 1) / 2;
      if (nodes_[ch[mid].id].count < k) hi = mid - 1; else lo = mid;
    }
    std::swap(ch[lo], ch[i]);
    nodes_[ch[i].id].slot = i;
    nn.slot = lo;
  }
  nn.count = k - 1;
}

}  // namespace sse
