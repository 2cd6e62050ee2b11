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

void DraftMerger::add(const Draft& d) {
  ids_.clear();
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    const int32_t par = d.parents[i] < 0 ? -1 : ids_[d.parents[i]];
    int32_t found = -1, last = -1;
    // Siblings are kept in merge order; a new node goes at the end.
    for (int32_t c = par < 0 ? first_root_ : nodes_[par].first_child; c >= 0;
         c = nodes_[c].next_sibling) {
      if (nodes_[c].token == d.tokens[i]) {
        found = c;
        break;
      }
      last = c;
    }
    if (found < 0) {
      found = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(Node{d.tokens[i], d.probs[i], -1, -1});
      if (last >= 0) {
        nodes_[last].next_sibling = found;
      } else if (par < 0) {
        first_root_ = found;
      } else {
        nodes_[par].first_child = found;
      }
    } else if (d.probs[i] > nodes_[found].prob) {
      nodes_[found].prob = d.probs[i];
    }
    ids_.push_back(found);
  }
}

void DraftMerger::merge(const Draft& a, const Draft& b, int max_nodes, Draft& out) {
  out.clear();
  out.match_len = a.score >= b.score ? a.match_len : b.match_len;
  nodes_.clear();
  first_root_ = -1;
  add(a);
  add(b);
  // Max-heap: higher probability first, then the earlier-merged node.
  const auto cmp = [](const Cand& x, const Cand& y) {
    return x.prob < y.prob || (x.prob == y.prob && x.node > y.node);
  };
  heap_.clear();
  for (int32_t c = first_root_; c >= 0; c = nodes_[c].next_sibling) {
    heap_.push_back(Cand{nodes_[c].prob, c, -1});
  }
  std::make_heap(heap_.begin(), heap_.end(), cmp);
  while (!heap_.empty() && static_cast<int>(out.tokens.size()) < max_nodes) {
    std::pop_heap(heap_.begin(), heap_.end(), cmp);
    const Cand c = heap_.back();
    heap_.pop_back();
    const int32_t idx = static_cast<int32_t>(out.tokens.size());
    out.tokens.push_back(nodes_[c.node].token);
    out.parents.push_back(c.parent);
    out.probs.push_back(c.prob);
    out.score += c.prob;
    for (int32_t k = nodes_[c.node].first_child; k >= 0; k = nodes_[k].next_sibling) {
      heap_.push_back(Cand{nodes_[k].prob, k, idx});
      std::push_heap(heap_.begin(), heap_.end(), cmp);
    }
  }
}

}  // namespace sse
