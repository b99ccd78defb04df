// Public entry points run their body through no_throw: an allocation failure, or any other
// exception a dependency throws, becomes an error value naming `what` instead of escaping
// to the embedder (the API promises Status/Result, never an exception or an abort).
#pragma once

#include <exception>
#include <new>
#include <string>

#include "switchboard/status.h"

namespace switchboard {

template <class F>
auto no_throw(const std::string& what, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kResourceExhausted, what + ": out of memory");
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, what + ": " + e.what());
  }
}

}  // namespace switchboard
