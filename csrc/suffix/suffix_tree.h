// Depth-bounded, path-compressed suffix tree over a set of growing token
// sequences, with an occurrence count on every node.
//
// Semantics (identical to sglang_spec_ext/suffix/reference.py): for each stored
// sequence s and each start i, the string s[i : i + max_depth] is inserted; the
// count of a string x (|x| <= max_depth) is the number of its occurrences in the
// stored sequences. A node covers a maximal run of positions with one count and
// a single continuation: it is explicit where the tree branches or where an
// inserted string ends ("endings").
//
// Edges are not copied: a node refers to an occurrence of its whole path string
// (ref_seq, ref_idx = index of the edge's first token). Appending a token to a
// sequence extends its at most max_depth "active" strings, each in O(1) expected
// time, so the tree also hands out, for free, the node of every suffix of every
// growing sequence (used for matching). Removing a sequence removes all of its
// strings. Nodes that still refer to a removed sequence are re-pointed: to an
// occurrence below them (a child's reference), or else to a copy of their path
// string (at most max_depth tokens each) in a small "fragment" sequence, so a
// removed sequence never stays pinned whole and the tree never needs a
// stop-the-world rebuild. Freed node slots are reused (a free list), so the
// node array stays at its high-water mark, itself bounded by the token bound:
// a tree over n live tokens has fewer than 2n nodes (every leaf and every
// one-child node ends an inserted string, at most one per token; branching
// nodes are fewer than leaves). A live sequence can also drop its oldest
// strings (trim_front: a sliding window, for the per-request trees).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "child_map.h"

namespace sse {

struct Child {
  int32_t token;  // first token of the child's edge
  int32_t id;
};

struct Node {
  int32_t count = 0;    // occurrences of the path string
  int32_t endings = 0;  // inserted strings that end exactly at this node
  int32_t token = 0;    // first token of the edge
  int32_t length = 0;   // edge length in tokens
  int32_t depth = 0;    // length of the path string (at the end of the edge)
  int32_t parent = -1;
  int32_t slot = 0;     // index in the parent's children
  int32_t ref_seq = -1;
  int32_t ref_idx = 0;  // index of the edge's first token in ref_seq
  bool indexed = false;  // children also in the tree's hash index (many children)
  std::vector<Child> children;  // sorted by count, descending (ties unordered)
};

// A point in the tree: `off` tokens of `node`'s edge consumed (1..length).
struct Pos {
  int32_t node = 0;
  int32_t off = 0;
};

// One continuation of a position.
struct Next {
  int32_t token;
  int32_t count;
  double prob;
  Pos pos;
};

class SuffixTree {
 public:
  // Nodes with more children than kIndexAbove are looked up through the hash
  // index; they leave it again below kUnindexBelow (hysteresis).
  static constexpr size_t kIndexAbove = 12;
  static constexpr size_t kUnindexBelow = 6;
  static constexpr size_t kNodeBytes = sizeof(Node);

  explicit SuffixTree(int max_depth);

  int max_depth() const { return max_depth_; }

  // Sequences.
  int add_sequence();  // returns its id; sequences start empty and growing
  void extend(int sid, const int32_t* tokens, size_t n);
  void finish_sequence(int sid);  // no more tokens: drop its active strings
  void remove_sequence(int sid);  // removes all of its strings
  // Removes the strings starting before `first` (a sliding window over a live
  // sequence); needs first <= size - max_depth (only complete strings go).
  // The tokens stay readable (nodes may refer to them; 4 bytes each).
  void trim_front(int sid, int64_t first);
  int64_t window_start(int sid) const { return seqs_[sid].first; }
  int64_t live_size(int sid) const {
    return static_cast<int64_t>(seqs_[sid].tokens.size()) - seqs_[sid].first;
  }
  const std::vector<int32_t>& tokens(int sid) const { return seqs_[sid].tokens; }
  // Number of suffixes of `sid` whose node is known (0 once finished).
  int tracked(int sid) const;
  // Node where the suffix of length m (1 <= m <= tracked) of `sid` ends.
  Pos tracked_pos(int sid, int m) const;
  // Position of the string s[0:m], or node -1 when it does not occur.
  Pos walk(const int32_t* s, int m) const;

  // Counts and continuations.
  int32_t count(Pos p) const { return nodes_[p.node].count; }
  // Continuations of `p` whose path probability (`prob` times the conditional
  // frequency) is >= min_prob, best first by (count desc, token asc), at most
  // `limit`. A continuation taken by every occurrence keeps `prob` exactly.
  void next_tokens(Pos p, double prob, double min_prob, int limit, std::vector<Next>& out) const;

  // Size.
  int64_t live_tokens() const { return live_tokens_; }
  int64_t pinned_tokens() const { return pinned_tokens_; }
  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size() - free_.size()); }
  int64_t node_slots() const { return static_cast<int64_t>(nodes_.size()); }  // high-water
  int64_t num_sequences() const { return num_live_; }
  // Bytes held: node array (up to its high-water mark), child arrays (glibc malloc chunk
  // sizes, tracked as they change), the child hash index and token arrays.
  int64_t memory_bytes() const;
  // Reserve address space for n nodes (pages are touched only when used), so
  // growing the node array never copies it.
  void reserve_nodes(size_t n) { nodes_.reserve(n); }

  // Structural invariants (counts, compaction, child order and index, edge
  // references); returns "" when they hold. For tests: walks the whole tree.
  std::string check() const;
  // Rebuilds from the live sequences now (tests and tools only: nothing calls
  // it on the serving path).
  void compact() { rebuild(); }

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    std::vector<int32_t> active;  // active[j]: node of the suffix of length j (j=0: root)
    int64_t first = 0;            // strings starting before this index were trimmed
    int32_t refs = 0;             // nodes referring to these tokens
    bool live = false;            // stored (not removed)
    bool used = false;            // slot taken (live or pinned)
  };

  int32_t token_at(const Node& n, int32_t off) const {
    return seqs_[n.ref_seq].tokens[n.ref_idx + off];
  }
  // Child lookup: a scan of the inline tokens, or the hash index for nodes
  // with many children.
  int32_t child(int32_t node, int32_t token) const {
    const Node& n = nodes_[node];
    if (n.indexed) return index_.find(ChildMap::key(node, token));
    for (const Child& c : n.children) {
      if (c.token == token) return c.id;
    }
    return -1;
  }

  void append(int sid, int32_t token);
  int32_t step(int32_t x, int32_t t, int sid, int32_t end);
  int32_t new_node(int32_t parent, int32_t token, int32_t count, int sid, int32_t ref_idx);
  void free_node(int32_t n);
  void set_ref(int32_t n, int sid, int32_t ref_idx);
  void release_ref(int sid);
  void add_child(int32_t parent, int32_t c);
  void set_child(int32_t parent, int32_t slot, int32_t token, int32_t c);
  void pop_child(int32_t parent);
  void inc_count(int32_t n);
  void dec_count(int32_t n);
  void merge_into_child(int32_t x);
  void remove_string(const int32_t* s, int len);
  void repoint_refs(int sid);
  void push_child(int32_t parent, Child c);
  void account_children(size_t old_cap, size_t new_cap);
  void rebuild();

  int max_depth_;
  std::vector<Node> nodes_;  // nodes_[0] is the root
  std::vector<int32_t> free_;
  ChildMap index_;  // (parent, token) -> child, for indexed parents only
  std::vector<Seq> seqs_;
  std::vector<int32_t> free_seqs_;
  int64_t live_tokens_ = 0;
  int64_t pinned_tokens_ = 0;
  int64_t num_live_ = 0;
  int64_t child_bytes_ = 0;    // heap bytes of all child arrays
  std::vector<int32_t> path_;  // scratch for remove_string
  std::vector<int32_t> touched_;  // nodes that may refer to a sequence being removed
};

}  // namespace sse
