// libascender.so has no sources of its own: it is linked from the static library's objects (whole-archive, see
// cmake/install.cmake), so the library is compiled once for both. CMake needs one source per library target.
namespace asc::detail {
int shared_library_marker = 0;
}  // namespace asc::detail
