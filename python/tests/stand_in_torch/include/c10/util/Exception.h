// A stand-in for torch's c10/util/Exception.h: the part the pluggable
// path's entry (cachealloc/native/pluggable.cpp) uses, with torch's names
// and shapes (c10::Error and c10::OutOfMemoryError built from a source
// location and a message, thrown by C10_THROW_ERROR), for the tests of a
// stand-in torch (python/tests/test_ctypes.py) on a machine without one.
#pragma once
#include <cstdint>
#include <exception>
#include <string>

namespace c10 {

struct SourceLocation {
    const char* function;
    const char* file;
    uint32_t line;
};

class Error : public std::exception {
   public:
    Error(SourceLocation, std::string msg) : msg_(std::move(msg)) {}
    const char* what() const noexcept override { return msg_.c_str(); }

   private:
    std::string msg_;
};

class OutOfMemoryError : public Error {
    using Error::Error;
};

}  // namespace c10

#define C10_THROW_ERROR(err_type, msg) \
    throw ::c10::err_type({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg)
