// pagedkv._C: the extension module. The Python package (python/pagedkv) wraps it.
#include "common.hpp"

NB_MODULE(_C, m) {
  m.doc() = "pagedkv C++ runtime (use the pagedkv package, not this module)";
  using namespace pagedkv::python;  // NOLINT: registration only
  register_errors(m);
  register_types(m);
  register_arrays(m);
  nb::class_<PyCache> cache = register_cache(m);
  register_batch(m, cache);
  register_reference(m, cache);
  register_model_cache(m);
  register_storage(m);
  register_regions(m, cache);
#ifdef PAGEDKV_PYTHON_EVENTS
  register_events(m);  // built with pagedkv_events (bindings/python/CMakeLists.txt)
#endif
}
