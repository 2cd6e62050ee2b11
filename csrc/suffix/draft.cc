#include "draft.h"

#include <algorithm>

namespace sse {

namespace {
// Max-heap order: higher probability first, then earlier push.
bool heap_less(const double pa, const int64_t oa, const double pb, const int64_t ob) {
  return pa < pb || (pa == pb && oa > ob);
}
}  // namespace

void Grower::push_children(const SuffixTree& tree, Pos pos, double prob, int32_t parent,
                           int32_t depth, int limit, double min_prob) {
  tree.next_tokens(pos, prob, min_prob, limit, next_);
  for (const Next& nx : next_) {
    heap_.push_back(Cand{nx.prob, order_++, nx.pos, nx.token, parent, depth + 1});
    std::push_heap(heap_.begin(), heap_.end(), [](const Cand& a, const Cand& b) {
      return heap_less(a.prob, a.order, b.prob, b.order);
    });
  }
}

void Grower::grow(const SuffixTree& tree, Pos start, int start_depth, int budget, double min_prob,
                  bool use_tree, Draft& out) {
  out.clear();
  const int max_depth = tree.max_depth();
  // A node at max_depth has no continuations in the tree: the draft is cut.
  out.depth_limited = start_depth == max_depth;
  if (budget <= 0) return;
  if (!use_tree) {
    Pos pos = start;
    double prob = 1.0;
    int depth = start_depth;
    while (static_cast<int>(out.tokens.size()) < budget) {
      tree.next_tokens(pos, prob, min_prob, 1, next_);
      if (next_.empty()) break;
      const Next nx = next_[0];
      out.parents.push_back(static_cast<int32_t>(out.tokens.size()) - 1);
      out.tokens.push_back(nx.token);
      out.probs.push_back(nx.prob);
      out.score += nx.prob;
      if (++depth == max_depth) out.depth_limited = true;
      pos = nx.pos;
      prob = nx.prob;
    }
    return;
  }
  heap_.clear();
  order_ = 0;
  push_children(tree, start, 1.0, -1, start_depth, budget, min_prob);
  const auto cmp = [](const Cand& a, const Cand& b) {
    return heap_less(a.prob, a.order, b.prob, b.order);
  };
  while (!heap_.empty() && static_cast<int>(out.tokens.size()) < budget) {
    std::pop_heap(heap_.begin(), heap_.end(), cmp);
    const Cand c = heap_.back();
    heap_.pop_back();
    const int32_t idx = static_cast<int32_t>(out.tokens.size());
    out.tokens.push_back(c.token);
    out.parents.push_back(c.parent);
    out.probs.push_back(c.prob);
    out.score += c.prob;
    if (c.depth == max_depth) out.depth_limited = true;
    // Children ranked below the remaining budget can never be popped in time.
    const int remaining = budget - idx - 1;
    if (remaining > 0) push_children(tree, c.pos, c.prob, idx, c.depth, remaining, min_prob);
  }
}

}  // namespace sse
