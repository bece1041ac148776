// Status -> Python exception: one class per StatusCode, all subclasses of PagedKvError, defined
// in python/pagedkv/errors.py and registered here when the package imports.
#include <array>

#include "common.hpp"

namespace pagedkv::python {
namespace {

constexpr size_t kNumCodes = static_cast<size_t>(StatusCode::kInternal) + 1;
// Owned references that live as long as the process: the interpreter may finalise before
// static destructors run, so they are never released.
std::array<PyObject*, kNumCodes> error_classes{};

void raise(const Status& s) {
  const size_t code = static_cast<size_t>(s.code());
  PyObject* cls = code < kNumCodes ? error_classes[code] : nullptr;
  if (cls == nullptr) {  // the package did not register its classes (someone imported _C alone)
    PyErr_SetString(PyExc_RuntimeError, s.to_string().c_str());
    return;
  }
  nb::object exc = nb::borrow(cls)(static_cast<int>(s.code()), s.message());
  PyErr_SetObject(cls, exc.ptr());
}

}  // namespace

void register_errors(nb::module_& m) {
  m.def(
      "_register_error_classes",
      [](nb::dict classes) {
        for (auto [key, value] : classes) {
          const size_t code = nb::cast<size_t>(key);
          if (code >= kNumCodes) throw_invalid("status code out of range");
          Py_XDECREF(error_classes[code]);
          error_classes[code] = nb::borrow(value).release().ptr();
        }
      },
      "Registers the exception class raised for each status code (called by the package).");
  m.def(
      "_raise_status",
      [](int code, const std::string& message) {
        throw StatusError(Status(static_cast<StatusCode>(code), message));
      },
      "Raises the exception of a status code (tests of the error bridge).");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      raise(e.status());
    }
  });
}

}  // namespace pagedkv::python
