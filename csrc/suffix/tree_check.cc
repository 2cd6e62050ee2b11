// SuffixTree::check(): the invariants every operation must preserve.
#include <string>

#include "suffix_tree.h"

namespace sse {

std::string SuffixTree::check() const {
  const auto fail = [](int32_t n, const std::string& what) {
    return "node " + std::to_string(n) + ": " + what;
  };
  std::vector<int32_t> stack{0};
  size_t seen = 0;
  size_t indexed_children = 0;
  while (!stack.empty()) {
    const int32_t id = stack.back();
    stack.pop_back();
    ++seen;
    const Node& n = nodes_[id];
    int64_t below = 0;
    for (size_t i = 0; i < n.children.size(); ++i) {
      const int32_t c = n.children[i].id;
      const Node& cn = nodes_[c];
      if (n.children[i].token != cn.token) return fail(c, "inline token mismatch");
      if (cn.parent != id || cn.slot != static_cast<int32_t>(i)) return fail(c, "bad parent/slot");
      if (i > 0 && nodes_[n.children[i - 1].id].count < cn.count) return fail(id, "children unsorted");
      if (child(id, cn.token) != c) return fail(c, "child lookup mismatch");
      if (n.indexed && index_.find(ChildMap::key(id, cn.token)) != c) return fail(c, "index");
      if (n.indexed) ++indexed_children;
      if (cn.count <= 0 || cn.length <= 0) return fail(c, "empty node");
      if (cn.depth != n.depth + cn.length || cn.depth > max_depth_) return fail(c, "bad depth");
      const Seq& s = seqs_[cn.ref_seq];
      if (!s.used) return fail(c, "reference to a freed sequence");
      const int32_t start = cn.ref_idx - n.depth;
      if (start < 0 || cn.ref_idx + cn.length > static_cast<int32_t>(s.tokens.size())) {
        return fail(c, "reference out of range");
      }
      if (s.tokens[cn.ref_idx] != cn.token) return fail(c, "edge token mismatch");
      below += cn.count;
      stack.push_back(c);
    }
    if (n.indexed && n.children.size() < kUnindexBelow) return fail(id, "indexed, few children");
    if (!n.indexed && n.children.size() > kIndexAbove) return fail(id, "many children, no index");
    if (id == 0) continue;
    if (n.count != n.endings + below) return fail(id, "count != endings + children");
    if (n.endings == 0 && n.children.size() == 1) return fail(id, "not compacted");
    // The reference must spell the whole path string.
    const Seq& s = seqs_[n.ref_seq];
    int32_t pos = n.ref_idx + n.length;
    for (int32_t a = id; a != 0; a = nodes_[a].parent) {
      const Node& an = nodes_[a];
      pos -= an.length;
      for (int32_t k = 0; k < an.length; ++k) {
        if (s.tokens[pos + k] != token_at(an, k)) return fail(id, "reference spells another path");
      }
    }
  }
  if (seen != nodes_.size() - free_.size()) return "unreachable nodes";
  if (index_.size() != indexed_children) return "child index size mismatch";
  int64_t live = 0, pinned = 0;
  for (const Seq& s : seqs_) {
    if (s.live) live += static_cast<int64_t>(s.tokens.size()) - s.first;
    else if (s.used) pinned += static_cast<int64_t>(s.tokens.size());
  }
  if (live != live_tokens_ || pinned != pinned_tokens_) return "token accounting mismatch";
  if (nodes_[0].count != live_tokens_) return "root count mismatch";
  return "";
}

}  // namespace sse
