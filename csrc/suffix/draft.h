// Growing a draft from a matched position of a suffix tree.
//
// Tree mode: best-first by path probability (the product of conditional
// continuation frequencies), ties broken by push order, children pushed by
// (count desc, token asc); chain mode: follow the best continuation. Both stop
// at `budget` nodes and never take a continuation below `min_prob`.
#pragma once

#include <cstdint>
#include <vector>

#include "suffix_tree.h"

namespace sse {

struct Draft {
  std::vector<int32_t> tokens;
  std::vector<int32_t> parents;  // -1: child of the root (the last committed token)
  std::vector<double> probs;
  double score = 0.0;
  int match_len = 0;
  bool depth_limited = false;  // the match or a node sits at the tree's maximum depth

  void clear() {
    tokens.clear();
    parents.clear();
    probs.clear();
    score = 0.0;
    match_len = 0;
    depth_limited = false;
  }
};

class Grower {
 public:
  // `start` is the position of the matched string, `start_depth` its length.
  void grow(const SuffixTree& tree, Pos start, int start_depth, int budget, double min_prob,
            bool use_tree, Draft& out);

 private:
  struct Cand {
    double prob;
    int64_t order;
    Pos pos;
    int32_t token;
    int32_t parent;
    int32_t depth;
  };
  void push_children(const SuffixTree& tree, Pos pos, double prob, int32_t parent, int32_t depth,
                     int limit, double min_prob);

  std::vector<Cand> heap_;
  std::vector<Next> next_;
  int64_t order_ = 0;
};

// One tree from two drafts by path probability (the reference's merge_drafts):
// nodes merged by token path (`a` first, then `b`; a shared path keeps the larger
// probability), then the best `max_nodes` taken best first, a node becoming a
// candidate once its parent is taken; ties go to the earlier-merged node.
class DraftMerger {
 public:
  void merge(const Draft& a, const Draft& b, int max_nodes, Draft& out);

 private:
  struct Node {
    int32_t token;
    double prob;
    int32_t first_child;
    int32_t next_sibling;
  };
  struct Cand {
    double prob;
    int32_t node;
    int32_t parent;  // index in the output
  };
  void add(const Draft& d);

  std::vector<Node> nodes_;
  std::vector<int32_t> ids_;
  int32_t first_root_ = -1;
  std::vector<Cand> heap_;
};

}  // namespace sse
