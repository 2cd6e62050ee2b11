// Python bindings: sglang_spec_ext.suffix._native.Engine, the compiled twin of
// sglang_spec_ext.suffix.reference.ReferenceEngine (same methods, same results).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine.h"

namespace py = pybind11;

namespace {

constexpr long long kMaxToken = 0x7FFFFFFFLL;

int32_t checked_token(PyObject* item) {
  const long long v = PyLong_AsLongLong(item);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (v < 0 || v > kMaxToken) {
    throw py::value_error("token ids must be in [0, 2**31 - 1], got " + std::to_string(v));
  }
  return static_cast<int32_t>(v);
}

// Accepts a list, a tuple or any iterable of ints (numpy arrays included).
// Everything is validated before the caller changes any state.
void read_tokens(py::handle obj, std::vector<int32_t>& out) {
  out.clear();
  PyObject* o = obj.ptr();
  if (PyList_Check(o) || PyTuple_Check(o)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject** items = PySequence_Fast_ITEMS(o);
    out.reserve(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) out.push_back(checked_token(items[i]));
    return;
  }
  if (PyUnicode_Check(o) || PyBytes_Check(o)) throw py::type_error("tokens must be a sequence of ints");
  for (py::handle item : py::iter(obj)) out.push_back(checked_token(item.ptr()));
}

py::tuple to_python(const sse::Draft& d) {
  const Py_ssize_t n = static_cast<Py_ssize_t>(d.tokens.size());
  py::list tokens(n), parents(n), probs(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyList_SET_ITEM(tokens.ptr(), i, PyLong_FromLong(d.tokens[i]));
    PyList_SET_ITEM(parents.ptr(), i, PyLong_FromLong(d.parents[i]));
    PyList_SET_ITEM(probs.ptr(), i, PyFloat_FromDouble(d.probs[i]));
  }
  return py::make_tuple(tokens, parents, probs, d.score, d.match_len);
}

// A corpus tree built off the engine (the GIL released while it builds).
struct PyCorpus {
  std::shared_ptr<const sse::CorpusTree> corpus;
  int64_t tokens() const { return corpus->tokens; }
  int64_t memory_bytes() const { return corpus->tree->memory_bytes(); }
};

PyCorpus build_corpus(py::handle docs, int max_depth) {
  if (max_depth < 1) throw py::value_error("max_depth must be >= 1");
  std::vector<std::vector<int32_t>> all;
  for (py::handle d : py::iter(docs)) {
    all.emplace_back();
    read_tokens(d, all.back());
  }
  py::gil_scoped_release release;
  return PyCorpus{sse::build_corpus(all, max_depth)};
}

class PyEngine {
 public:
  explicit PyEngine(const sse::EngineConfig& cfg) : engine_(cfg) {}

  void start(int64_t h, py::handle prompt, const std::string& scope, bool use_global) {
    read_tokens(prompt, buf_);
    engine_.start(h, buf_, scope, use_global);
  }
  void extend(int64_t h, py::handle tokens) {
    read_tokens(tokens, buf_);
    engine_.extend(h, buf_);
  }
  py::tuple speculate(int64_t h, int max_nodes) { return to_python(engine_.speculate(h, max_nodes)); }
  py::list speculate_batch(py::handle handles, int max_nodes) {
    std::vector<int64_t> hs;
    for (py::handle h : py::iter(handles)) hs.push_back(h.cast<int64_t>());
    py::list out(hs.size());
    engine_.begin_step();
    for (size_t i = 0; i < hs.size(); ++i) {
      PyList_SET_ITEM(out.ptr(), i, to_python(engine_.draft(hs[i], max_nodes)).release().ptr());
    }
    engine_.end_step();
    return out;
  }
  void finish(int64_t h) { engine_.finish(h); }
  void abort(int64_t h) { engine_.abort(h); }
  void reset() { engine_.reset(); }
  void flush() { engine_.flush(); }
  std::string check() const { return engine_.check(); }
  void add_corpus(const std::string& name, const PyCorpus& corpus,
                  const std::vector<std::string>& scopes) {
    engine_.add_corpus(name, corpus.corpus, scopes);
  }
  bool remove_corpus(const std::string& name) { return engine_.remove_corpus(name); }
  py::dict corpora() const {
    py::dict d;
    for (const auto& kv : engine_.corpora()) d[py::str(kv.first)] = kv.second;
    return d;
  }
  py::list export_cached() const {
    py::list out;
    for (const auto& kv : engine_.export_cached()) {
      out.append(py::make_tuple(py::str(kv.first), py::cast(kv.second)));
    }
    return out;
  }
  void import_cached(const std::string& scope, py::handle tokens) {
    read_tokens(tokens, buf_);
    engine_.import_cached(scope, buf_);
  }
  void compact() { engine_.compact(); }
  py::dict stats() const {
    const sse::EngineStats s = engine_.stats();
    py::dict d;
    d["active_requests"] = s.active_requests;
    d["cached_requests"] = s.cached_requests;
    d["cached_tokens"] = s.cached_tokens;
    d["pinned_tokens"] = s.pinned_tokens;
    d["global_nodes"] = s.global_nodes;
    d["local_nodes"] = s.local_nodes;
    d["local_tokens"] = s.local_tokens;
    d["pending_tokens"] = s.pending_tokens;
    d["memory_bytes"] = s.memory_bytes;
    d["scopes"] = s.scopes;
    d["corpora"] = s.corpora;
    d["corpus_tokens"] = s.corpus_tokens;
    return d;
  }

 private:
  sse::Engine engine_;
  std::vector<int32_t> buf_;
};

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "Compiled suffix-tree drafter core (see sglang_spec_ext.suffix.reference).";
  // Sizes for memory accounting (sglang_spec_ext.suffix.memory).
  m.attr("NODE_BYTES") = static_cast<int64_t>(sse::SuffixTree::kNodeBytes);
  m.attr("CHILD_BYTES") = static_cast<int64_t>(sizeof(sse::Child));
  py::class_<PyEngine>(m, "Engine")
      .def(py::init([](int max_depth, double max_spec_factor, double max_spec_offset,
                       double min_token_prob, int64_t max_cached_requests,
                       int64_t max_cached_tokens, bool cache_prompts, bool use_tree,
                       int64_t max_request_tokens, int64_t global_prompt_cap,
                       int64_t step_insert_tokens, bool merge_drafts, int64_t max_scope_tokens) {
             sse::EngineConfig c;
             c.max_depth = max_depth;
             c.max_spec_factor = max_spec_factor;
             c.max_spec_offset = max_spec_offset;
             c.min_token_prob = min_token_prob;
             c.max_cached_requests = max_cached_requests;
             c.max_cached_tokens = max_cached_tokens;
             c.cache_prompts = cache_prompts;
             c.use_tree = use_tree;
             c.max_request_tokens = max_request_tokens;
             c.global_prompt_cap = global_prompt_cap;
             c.step_insert_tokens = step_insert_tokens;
             c.merge_drafts = merge_drafts;
             c.max_scope_tokens = max_scope_tokens < 0 ? max_cached_tokens : max_scope_tokens;
             return new PyEngine(c);
           }),
           py::arg("max_depth"), py::arg("max_spec_factor"), py::arg("max_spec_offset"),
           py::arg("min_token_prob"), py::arg("max_cached_requests"),
           py::arg("max_cached_tokens"), py::arg("cache_prompts"), py::arg("use_tree"),
           py::arg("max_request_tokens"), py::arg("global_prompt_cap"),
           py::arg("step_insert_tokens"), py::arg("merge_drafts") = true,
           py::arg("max_scope_tokens") = -1)
      .def("start", &PyEngine::start, py::arg("h"), py::arg("prompt"), py::arg("scope") = "",
           py::arg("use_global") = true)
      .def("extend", &PyEngine::extend)
      .def("speculate", &PyEngine::speculate)
      .def("speculate_batch", &PyEngine::speculate_batch)
      .def("finish", &PyEngine::finish)
      .def("abort", &PyEngine::abort)
      .def("reset", &PyEngine::reset)
      .def("flush", &PyEngine::flush, "Insert every queued token now.")
      .def("stats", &PyEngine::stats)
      .def("_check", &PyEngine::check, "Invariants of every tree; '' when they hold (tests).")
      .def("_compact", &PyEngine::compact, "Rebuild the global trees now (tests).")
      .def("add_corpus", &PyEngine::add_corpus, py::arg("name"), py::arg("corpus"),
           py::arg("scopes"))
      .def("remove_corpus", &PyEngine::remove_corpus)
      .def("corpora", &PyEngine::corpora, "Corpus name -> tokens.")
      .def("export_cached", &PyEngine::export_cached,
           "Every cached sequence as (scope, tokens), oldest first.")
      .def("import_cached", &PyEngine::import_cached, py::arg("scope"), py::arg("tokens"));
  py::class_<PyCorpus>(m, "Corpus")
      .def_property_readonly("tokens", &PyCorpus::tokens)
      .def_property_readonly("memory_bytes", &PyCorpus::memory_bytes);
  m.def("build_corpus", &build_corpus, py::arg("docs"), py::arg("max_depth"),
        "A read-only suffix tree over documents (lists of token ids), one sequence each.");
}
