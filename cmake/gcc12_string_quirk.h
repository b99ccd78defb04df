// Force-included (-include) by GCC 12 builds only: libstdc++'s <string> with GCC 12's false
// -Wrestrict inside its own concatenation code ("x" + std::string, GCC bug 105329)
// silenced for the header's lines alone; the project's own lines keep the warning.
#pragma once
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wrestrict"
#include <string>
#pragma GCC diagnostic pop
