#pragma once

namespace railyard {
// Set by CMake from project(VERSION).
inline constexpr const char* kRailyardVersion = RAILYARD_VERSION_STRING;
}  // namespace railyard
