#include "engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

namespace sse {

namespace {
constexpr size_t kMaxReservedNodes = size_t{1} << 23;
// Node slots per live token above which a shrunken scope tree is rebuilt (a tree
// over n tokens needs fewer than 2n nodes), and the slack of small trees.
constexpr int64_t kCompactFactor = 4;
constexpr int64_t kCompactSlack = 64;

void append_tail(std::vector<int32_t>& out, const int32_t* t, size_t n, size_t keep) {
  if (n >= keep) {
    out.assign(t + n - keep, t + n);
    return;
  }
  out.insert(out.end(), t, t + n);
  if (out.size() > 2 * keep) out.erase(out.begin(), out.end() - keep);
}
}  // namespace

std::shared_ptr<const CorpusTree> build_corpus(const std::vector<std::vector<int32_t>>& docs,
                                               int max_depth) {
  auto c = std::make_shared<CorpusTree>();
  c->tree = std::make_unique<SuffixTree>(max_depth);
  for (const auto& d : docs) {
    if (d.empty()) continue;
    const int sid = c->tree->add_sequence();
    c->tree->extend(sid, d.data(), d.size());
    c->tree->finish_sequence(sid);
    c->tokens += static_cast<int64_t>(d.size());
  }
  return c;
}

Engine::Engine(const EngineConfig& cfg) : cfg_(cfg), credit_(cfg.step_insert_tokens) {
  if (cfg_.max_request_tokens < cfg_.max_depth) {
    throw std::invalid_argument("max_request_tokens must be >= max_depth");
  }
  reset();
}

Engine::Request& Engine::get(int64_t h) {
  auto it = reqs_.find(h);
  if (it == reqs_.end()) throw std::out_of_range("unknown request handle");
  return it->second;
}

bool Engine::global_enabled() const {
  return cfg_.max_cached_requests > 0 && cfg_.max_cached_tokens > 0;
}

int64_t Engine::global_prompt_tokens() const {
  if (!cfg_.cache_prompts) return 0;
  return std::min(cfg_.global_prompt_cap, cfg_.max_cached_tokens / 2);
}

// A new cached sequence of scope `key` (created if absent), the newest.
int64_t Engine::new_cached(const std::string& key, int64_t owner) {
  while (static_cast<int64_t>(cached_.size()) >= cfg_.max_cached_requests && evict_oldest()) {
  }
  auto it = scopes_.find(key);
  if (it == scopes_.end()) it = scopes_.emplace(key, std::make_unique<Scope>(cfg_.max_depth)).first;
  Scope* s = it->second.get();
  const int64_t uid = next_uid_++;
  fifo_.push_back(uid);
  s->fifo.push_back(uid);
  s->cached += 1;
  cached_.emplace(uid, Cached{s->tree.add_sequence(), s, key, owner, Queue{}, false});
  return uid;
}

void Engine::start(int64_t h, const std::vector<int32_t>& prompt, const std::string& scope,
                   bool use_global) {
  if (reqs_.count(h)) throw std::invalid_argument("request handle already active");
  const size_t n = prompt.size();
  Request r;
  r.local = std::make_unique<SuffixTree>(cfg_.max_depth);
  r.local->add_sequence();
  const size_t keep_local = std::min(n, static_cast<size_t>(cfg_.max_request_tokens));
  r.queue.tokens.assign(prompt.end() - keep_local, prompt.end());
  append_tail(r.tail, prompt.data(), n, static_cast<size_t>(cfg_.max_depth));
  r.scope = scope;
  r.use_global = use_global;
  if (global_enabled() && use_global) {
    r.guid = new_cached(scope, h);
    const size_t keep = std::min(n, static_cast<size_t>(global_prompt_tokens()));
    cached_.at(r.guid).queue.tokens.assign(prompt.end() - keep, prompt.end());
  }
  work_.emplace_back(h, r.guid);
  reqs_.emplace(h, std::move(r));
  advance();
}

void Engine::insert_local(Request& r, const int32_t* t, size_t n) {
  SuffixTree& tree = *r.local;
  tree.extend(0, t, n);
  const int64_t size = static_cast<int64_t>(tree.tokens(0).size());
  if (tree.live_size(0) > cfg_.max_request_tokens) tree.trim_front(0, size - cfg_.max_request_tokens);
}

// May evict `c` itself and its scope (the caller must not use them afterwards).
void Engine::global_extend(Cached& c, const int32_t* t, size_t n) {
  SuffixTree& tree = c.scope->tree;
  const int64_t before = tree.live_tokens();
  tree.extend(c.sid, t, n);
  total_live_ += tree.live_tokens() - before;
  const std::string key = c.key;
  enforce_bounds(key);
}


void Engine::extend(int64_t h, const std::vector<int32_t>& tokens) {
  Request& r = get(h);
  const size_t n = tokens.size();
  append_tail(r.tail, tokens.data(), n, static_cast<size_t>(cfg_.max_depth));
  if (!r.queue.empty()) {
    r.queue.tokens.insert(r.queue.tokens.end(), tokens.begin(), tokens.end());
  } else {
    insert_local(r, tokens.data(), n);
  }
  if (r.guid >= 0) {
    Cached& c = cached_.at(r.guid);
    if (!c.queue.empty()) {
      c.queue.tokens.insert(c.queue.tokens.end(), tokens.begin(), tokens.end());
    } else {
      global_extend(c, tokens.data(), n);
    }
  }
}

// Queued tokens, oldest request first: its tree, then the global tree.
void Engine::advance() {
  while (!work_.empty()) {
    const auto [h, uid] = work_.front();
    auto rit = reqs_.find(h);
    if (rit != reqs_.end() && !rit->second.queue.empty()) {
      if (credit_ <= 0) return;
      Queue& q = rit->second.queue;
      const size_t k = std::min(q.left(), static_cast<size_t>(credit_));
      insert_local(rit->second, q.tokens.data() + q.pos, k);
      q.pos += k;
      credit_ -= static_cast<int64_t>(k);
      if (q.empty()) q = Queue{};
      continue;
    }
    auto cit = uid >= 0 ? cached_.find(uid) : cached_.end();
    if (cit != cached_.end() && !cit->second.queue.empty()) {
      if (credit_ <= 0) return;
      Cached& c = cit->second;
      Queue& q = c.queue;
      const size_t k = std::min(q.left(), static_cast<size_t>(credit_));
      SuffixTree& tree = c.scope->tree;
      const int64_t before = tree.live_tokens();
      tree.extend(c.sid, q.tokens.data() + q.pos, k);
      q.pos += k;
      credit_ -= static_cast<int64_t>(k);
      if (q.empty()) {
        q = Queue{};
        if (c.finished) tree.finish_sequence(c.sid);
      }
      total_live_ += tree.live_tokens() - before;
      const std::string key = c.key;
      enforce_bounds(key);  // may evict uid
      continue;
    }
    work_.pop_front();
  }
}

void Engine::flush() {
  credit_ = std::numeric_limits<int64_t>::max();
  advance();
  credit_ = cfg_.step_insert_tokens;
}

void Engine::finish(int64_t h) {
  Request& r = get(h);
  if (r.guid >= 0) {
    Cached& c = cached_.at(r.guid);
    if (c.queue.empty()) {
      c.scope->tree.finish_sequence(c.sid);
    } else {
      c.finished = true;
    }
    c.owner = -1;
  }
  reqs_.erase(h);
}

void Engine::abort(int64_t h) {
  Request& r = get(h);
  if (r.guid >= 0) drop_cached(r.guid);
  reqs_.erase(h);
}

void Engine::drop_cached(int64_t uid) {
  auto it = cached_.find(uid);
  Cached& c = it->second;
  Scope* s = c.scope;
  const int64_t before = s->tree.live_tokens();
  s->tree.remove_sequence(c.sid);
  total_live_ += s->tree.live_tokens() - before;
  if (c.owner >= 0) reqs_.at(c.owner).guid = -1;
  s->cached -= 1;
  const std::string key = c.key;
  cached_.erase(it);
  if (s->cached == 0 && !key.empty()) {
    scopes_.erase(key);
  } else if (s->tree.node_slots() > kCompactFactor * s->tree.live_tokens() + kCompactSlack) {
    // A tree keeps its node high-water mark; one that shrank far below it (its
    // scope lost sequences to other scopes) gives the memory back.
    s->tree.compact();
  }
}

void Engine::reset() {
  reqs_.clear();
  cached_.clear();
  fifo_.clear();
  work_.clear();
  credit_ = cfg_.step_insert_tokens;
  total_live_ = 0;
  scopes_.clear();
  // The shared scope stays (its nodes reserved); other scopes grow on demand.
  Scope& shared = *scopes_.emplace("", std::make_unique<Scope>(cfg_.max_depth)).first->second;
  if (global_enabled()) {
    const int64_t want = 2 * std::min(cfg_.max_cached_tokens, cfg_.max_scope_tokens) + 2;
    shared.tree.reserve_nodes(std::min(static_cast<size_t>(want), kMaxReservedNodes));
  }
}

void Engine::compact() {
  for (auto& kv : scopes_) kv.second->tree.compact();
}

bool Engine::evict_oldest() {
  while (!fifo_.empty()) {
    const int64_t uid = fifo_.front();
    fifo_.pop_front();
    if (cached_.count(uid) == 0) continue;  // aborted or evicted earlier
    drop_cached(uid);
    return true;
  }
  return false;
}

bool Engine::evict_oldest_in(Scope& s) {
  while (!s.fifo.empty()) {
    const int64_t uid = s.fifo.front();
    s.fifo.pop_front();
    if (cached_.count(uid) == 0) continue;
    drop_cached(uid);  // may erase `s`
    return true;
  }
  return false;
}

// Scope `key` within max_scope_tokens (its oldest first), then every scope
// together within max_cached_tokens (the oldest of any scope first).
void Engine::enforce_bounds(const std::string& key) {
  for (;;) {
    auto it = scopes_.find(key);
    if (it == scopes_.end() || it->second->tree.live_tokens() <= cfg_.max_scope_tokens) break;
    if (!evict_oldest_in(*it->second)) break;
  }
  while (total_live_ > cfg_.max_cached_tokens && evict_oldest()) {
  }
}

const Engine::Scope* Engine::scope_of(const Request& r) const {
  if (!r.use_global) return nullptr;
  auto it = scopes_.find(r.scope);
  return it == scopes_.end() ? nullptr : it->second.get();
}

void Engine::add_corpus(const std::string& name, std::shared_ptr<const CorpusTree> corpus,
                        const std::vector<std::string>& scopes) {
  if (!corpus || !corpus->tree) throw std::invalid_argument("empty corpus");
  if (corpus->tree->max_depth() != cfg_.max_depth) {
    throw std::invalid_argument("corpus built with another max_depth");
  }
  corpora_[name] = {std::move(corpus), scopes};
}

bool Engine::remove_corpus(const std::string& name) { return corpora_.erase(name) != 0; }

std::vector<std::pair<std::string, int64_t>> Engine::corpora() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& kv : corpora_) out.emplace_back(kv.first, kv.second.first->tokens);
  return out;
}

std::vector<std::pair<std::string, std::vector<int32_t>>> Engine::export_cached() const {
  std::vector<std::pair<std::string, std::vector<int32_t>>> out;
  for (const int64_t uid : fifo_) {
    auto it = cached_.find(uid);
    if (it == cached_.end()) continue;
    const Cached& c = it->second;
    const std::vector<int32_t>& t = c.scope->tree.tokens(c.sid);
    std::vector<int32_t> all(t.begin() + c.scope->tree.window_start(c.sid), t.end());
    all.insert(all.end(), c.queue.tokens.begin() + c.queue.pos, c.queue.tokens.end());
    out.emplace_back(c.key, std::move(all));
  }
  return out;
}

void Engine::import_cached(const std::string& scope, const std::vector<int32_t>& tokens) {
  if (!global_enabled()) return;
  const int64_t uid = new_cached(scope, -1);
  Cached& c = cached_.at(uid);
  SuffixTree& tree = c.scope->tree;
  const int64_t before = tree.live_tokens();
  tree.extend(c.sid, tokens.data(), tokens.size());
  tree.finish_sequence(c.sid);
  total_live_ += tree.live_tokens() - before;
  enforce_bounds(scope);
}

int Engine::budget(int match_len, int max_nodes) const {
  const double b = std::floor(cfg_.max_spec_factor * match_len + cfg_.max_spec_offset + 1e-9);
  if (b <= 0.0) return 0;
  if (b >= static_cast<double>(max_nodes)) return max_nodes;
  return static_cast<int>(b);
}

// Best draft over all match lengths m (longest first; a shorter match wins only
// with a strictly higher score). Two exact shortcuts: the budget bounds the
// score, and a shorter suffix with the same count as the last one drafted has
// the same continuations (every occurrence extends to the longer one), so it
// cannot score higher unless that draft was cut by the tree's depth.
// Drafts scoring <= `floor` are of no use to the caller and not returned.
void Engine::best_in_tree(const SuffixTree& tree, int sid, const std::vector<int32_t>& hist,
                          int max_nodes, double floor, Draft& best) {
  best.clear();
  const int n = static_cast<int>(hist.size());
  const int longest_possible = std::min(cfg_.max_depth, n);
  const int tracked = sid >= 0 ? std::min(tree.tracked(sid), longest_possible) : 0;
  pos_.resize(longest_possible + 1);
  int longest = tracked;
  for (int m = 1; m <= tracked; ++m) pos_[m] = tree.tracked_pos(sid, m);
  for (int m = tracked + 1; m <= longest_possible; ++m) {
    const Pos p = tree.walk(hist.data() + n - m, m);
    if (p.node < 0) break;
    pos_[m] = p;
    longest = m;
  }
  int32_t ref_count = -1;
  bool ref_limited = true;
  for (int m = longest; m >= 1; --m) {
    const int b = budget(m, max_nodes);
    if (b <= std::max(best.score, floor)) break;
    const int32_t cnt = tree.count(pos_[m]);
    if (cnt == ref_count && !ref_limited) continue;
    grower_.grow(tree, pos_[m], m, b, cfg_.min_token_prob, cfg_.use_tree, scratch_);
    ref_count = cnt;
    ref_limited = scratch_.depth_limited;
    if (scratch_.score > std::max(best.score, floor)) {
      std::swap(best, scratch_);
      best.match_len = m;
    }
  }
}

const Draft& Engine::draft(int64_t h, int max_nodes) {
  Request& r = get(h);
  const std::vector<int32_t>& hist = r.tail;
  // A tree that still waits for some of the request's tokens is matched by
  // walking (sid -1): its tracked suffixes are not the history's suffixes.
  best_in_tree(*r.local, r.queue.empty() ? 0 : -1, hist, max_nodes, 0.0, local_best_);
  global_best_.clear();
  const bool merge = cfg_.merge_drafts && cfg_.use_tree;
  // Unmerged, a global or corpus draft wins only with a strictly higher score.
  const double floor = merge ? 0.0 : local_best_.score;
  const Scope* scope = global_enabled() ? scope_of(r) : nullptr;
  if (scope != nullptr) {
    int sid = -1;
    if (r.guid >= 0) {
      const Cached& c = cached_.at(r.guid);
      if (c.queue.empty()) sid = c.sid;
    }
    best_in_tree(scope->tree, sid, hist, max_nodes, floor, global_best_);
  }
  // The best corpus draft (first name on ties) replaces a lower-scoring global one.
  for (const auto& kv : corpora_) {
    const std::vector<std::string>& only = kv.second.second;
    // A corpus for listed scopes serves only requests of those scopes.
    if (!only.empty() &&
        (!r.use_global || std::find(only.begin(), only.end(), r.scope) == only.end())) {
      continue;
    }
    best_in_tree(*kv.second.first->tree, -1, hist, max_nodes, std::max(floor, global_best_.score),
                 corpus_best_);
    if (corpus_best_.score > global_best_.score) std::swap(global_best_, corpus_best_);
  }
  if (merge) {
    if (global_best_.tokens.empty()) return local_best_;
    if (local_best_.tokens.empty()) return global_best_;
    merger_.merge(local_best_, global_best_, max_nodes, merged_);
    return merged_;
  }
  return local_best_.score >= global_best_.score ? local_best_ : global_best_;
}

EngineStats Engine::stats() const {
  EngineStats s{};
  s.active_requests = static_cast<int64_t>(reqs_.size());
  s.cached_requests = static_cast<int64_t>(cached_.size());
  s.cached_tokens = total_live_;
  for (const auto& kv : scopes_) {
    const SuffixTree& t = kv.second->tree;
    s.pinned_tokens += t.pinned_tokens();
    s.global_nodes += t.num_nodes() - 1;
    s.memory_bytes += t.memory_bytes() + static_cast<int64_t>(sizeof(Scope) + kv.first.capacity());
  }
  s.scopes = static_cast<int64_t>(scopes_.size());
  for (const auto& kv : corpora_) {
    s.corpora += 1;
    s.corpus_tokens += kv.second.first->tokens;
    s.memory_bytes += kv.second.first->tree->memory_bytes();
  }
  for (const auto& kv : cached_) {
    s.pending_tokens += static_cast<int64_t>(kv.second.queue.left());
    s.memory_bytes += static_cast<int64_t>(kv.second.queue.tokens.capacity() * sizeof(int32_t));
  }
  for (const auto& kv : reqs_) {
    const Request& r = kv.second;
    s.local_nodes += r.local->num_nodes() - 1;
    s.local_tokens += r.local->live_tokens();
    s.pending_tokens += static_cast<int64_t>(r.queue.left());
    s.memory_bytes += r.local->memory_bytes() + static_cast<int64_t>(sizeof(SuffixTree)) +
                      static_cast<int64_t>((r.queue.tokens.capacity() + r.tail.capacity()) *
                                           sizeof(int32_t));
  }
  return s;
}

std::string Engine::check() const {
  int64_t live = 0;
  for (const auto& kv : scopes_) {
    const std::string err = kv.second->tree.check();
    if (!err.empty()) return "global tree of scope '" + kv.first + "': " + err;
    live += kv.second->tree.live_tokens();
  }
  if (live != total_live_) return "total live tokens out of step with the scopes' trees";
  std::string err;
  for (const auto& kv : reqs_) {
    err = kv.second.local->check();
    if (!err.empty()) return "request tree " + std::to_string(kv.first) + ": " + err;
  }
  return "";
}

}  // namespace sse
