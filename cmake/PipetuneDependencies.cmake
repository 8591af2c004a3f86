# Detects the optional parts of the product and says, one line each, what is left out.
# sim/ and the simulator CLI need none of them.

find_package(nlohmann_json 3.10 REQUIRED)
find_package(fmt REQUIRED)
find_package(Boost 1.71 REQUIRED)  # Boost.Graph is header-only
find_package(CLI11 QUIET CONFIG)
if(NOT CLI11_FOUND)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
endif()
find_package(Threads REQUIRED)

set(PIPETUNE_LEFT_OUT "")
macro(pipetune_left_out what why)
  list(APPEND PIPETUNE_LEFT_OUT "${what}: ${why}")
endmacro()

function(pipetune_wanted name out)
  if(${name} STREQUAL "OFF")
    set(${out} FALSE PARENT_SCOPE)
  else()
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()

# --- Google Test / Benchmark ----------------------------------------------------------------
find_package(GTest QUIET)
set(PIPETUNE_HAVE_GTEST ${GTest_FOUND})
if(PIPETUNE_BUILD_TESTS AND NOT GTest_FOUND)
  message(FATAL_ERROR "GoogleTest not found: run scripts/setup.sh or configure with -DPIPETUNE_BUILD_TESTS=OFF")
endif()
find_package(benchmark QUIET)
set(PIPETUNE_HAVE_BENCHMARK ${benchmark_FOUND})
if(PIPETUNE_BUILD_BENCH AND NOT benchmark_FOUND)
  pipetune_left_out("bench/" "Google Benchmark not found (libbenchmark-dev)")
endif()

# --- LibTorch ---------------------------------------------------------------------------
# The torch wheel lives in a virtual environment; its Python tells CMake where LibTorch is.
set(PIPETUNE_HAVE_TORCH FALSE)
pipetune_wanted(PIPETUNE_WITH_TORCH _want_torch)
if(_want_torch)
  if(NOT Torch_DIR AND EXISTS "${PIPETUNE_VENV}/bin/python")
    execute_process(
      COMMAND "${PIPETUNE_VENV}/bin/python" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
    if(_rc EQUAL 0 AND _torch_prefix)
      list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
    endif()
  endif()
  # TorchConfig enables the CUDA language itself when a toolkit is installed. We compile no
  # kernels, so name the architectures (no probe of a GPU that CI does not have) and a CUDA
  # dialect nvcc knows.
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "8.0;9.0" CACHE STRING "CUDA architectures for LibTorch's CMake")
  endif()
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  find_package(Torch QUIET)
  if(Torch_FOUND)
    set(PIPETUNE_HAVE_TORCH TRUE)
    # Torch_DIR is <site-packages>/torch/share/cmake/Torch; the wheel's CUDA libraries are in
    # <site-packages>/nvidia.
    get_filename_component(PIPETUNE_TORCH_SITE "${Torch_DIR}/../../../.." ABSOLUTE)
    # The torch wheel ships fmt headers of another version on its -isystem path; a -I link to
    # Debian's fmt (the one we link) puts ours first in every LibTorch target.
    # The fmt found above (Debian's, or the GPU kit's copy of it) says where its headers are.
    get_target_property(_fmt_includes fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
    find_path(PIPETUNE_FMT_INCLUDE_DIR fmt/format.h PATHS ${_fmt_includes} NO_DEFAULT_PATH)
    if(NOT PIPETUNE_FMT_INCLUDE_DIR)
      message(FATAL_ERROR "fmt/format.h not found beside the fmt package (${_fmt_includes})")
    endif()
    set(PIPETUNE_FMT_SHIM "${CMAKE_BINARY_DIR}/fmt-shim")
    file(MAKE_DIRECTORY "${PIPETUNE_FMT_SHIM}")
    file(CREATE_LINK "${PIPETUNE_FMT_INCLUDE_DIR}/fmt" "${PIPETUNE_FMT_SHIM}/fmt" SYMBOLIC)
    # The wheel's own CUDA/NCCL libraries must win over a system toolkit's when linking
    # libtorch_cuda's dependencies (they differ in version).
    if(PIPETUNE_TORCH_SITE)
      file(GLOB _nv_libs LIST_DIRECTORIES true "${PIPETUNE_TORCH_SITE}/nvidia/*/lib")
      if(_nv_libs)
        string(REPLACE ";" ":" _nv_path "${_nv_libs}")
        set(PIPETUNE_TORCH_LINK_OPTIONS "LINKER:-rpath-link,${_nv_path}")
      endif()
    endif()
  elseif(PIPETUNE_WITH_TORCH STREQUAL "ON")
    message(FATAL_ERROR "LibTorch not found (run scripts/setup.sh, or set Torch_DIR)")
  else()
    pipetune_left_out("executor/, profiler/, validate/ (pipetune profile, run and validate refuse, demo is a what-if)"
                      "LibTorch not found (run scripts/setup.sh)")
  endif()
else()
  pipetune_left_out("executor/, profiler/, validate/ (pipetune profile, run and validate refuse, demo is a what-if)"
                    "PIPETUNE_WITH_TORCH=OFF")
endif()

# --- CUDA / CUPTI (through LibTorch's CUDA build) --------------------------------------------
set(PIPETUNE_HAVE_CUDA FALSE)
set(PIPETUNE_HAVE_CUPTI FALSE)
pipetune_wanted(PIPETUNE_WITH_CUDA _want_cuda)
if(PIPETUNE_HAVE_TORCH AND _want_cuda)
  if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
    find_package(CUDAToolkit QUIET)
  endif()
  if(CUDAToolkit_FOUND)
    set(PIPETUNE_HAVE_CUDA TRUE)
    # Use the CUPTI the torch wheel ships (the one libtorch_cuda loads), else the toolkit's.
    find_path(PIPETUNE_CUPTI_INCLUDE_DIR cupti_activity.h
      HINTS "${PIPETUNE_TORCH_SITE}/nvidia/cu13/include" "${CUDAToolkit_INCLUDE_DIRS}"
            "${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/include")
    find_library(PIPETUNE_CUPTI_LIBRARY NAMES libcupti.so.13 libcupti.so.12 cupti NAMES_PER_DIR
      HINTS "${PIPETUNE_TORCH_SITE}/nvidia/cu13/lib" "${CUDAToolkit_LIBRARY_DIR}"
            "${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/lib64")
    if(PIPETUNE_CUPTI_INCLUDE_DIR AND PIPETUNE_CUPTI_LIBRARY)
      set(PIPETUNE_HAVE_CUPTI TRUE)
    else()
      pipetune_left_out("profiler CUPTI backend" "CUPTI headers or library not found (CUDA-event timing only)")
    endif()
  else()
    pipetune_left_out("CUDA paths (executor streams, CUPTI profiler)" "LibTorch has no CUDA or no CUDA toolkit")
  endif()
elseif(PIPETUNE_HAVE_TORCH)
  pipetune_left_out("CUDA paths" "PIPETUNE_WITH_CUDA=OFF")
endif()

# --- Gloo (c10d's CPU backend, for distributed runs) ------------------------------------
# The torch wheel has the Gloo backend compiled in but ships no gloo headers, which c10d's
# ProcessGroupGloo.hpp includes; Debian's libgloo-dev provides them. Headers only: linking
# Debian's libgloo too would put a second gloo beside the wheel's.
set(PIPETUNE_HAVE_GLOO FALSE)
if(PIPETUNE_HAVE_TORCH)
  find_path(PIPETUNE_GLOO_INCLUDE_DIR gloo/rendezvous/store.h)
  if(PIPETUNE_GLOO_INCLUDE_DIR)
    set(PIPETUNE_HAVE_GLOO TRUE)
  else()
    pipetune_left_out("distributed runs (Gloo)" "gloo headers not found (libgloo-dev)")
  endif()
endif()

# --- Qt6 ---------------------------------------------------------------------------------
set(PIPETUNE_HAVE_QT FALSE)
pipetune_wanted(PIPETUNE_WITH_QT _want_qt)
if(_want_qt)
  find_package(Qt6 QUIET COMPONENTS Core Gui Widgets)
  if(Qt6_FOUND)
    set(PIPETUNE_HAVE_QT TRUE)
  elseif(PIPETUNE_WITH_QT STREQUAL "ON")
    message(FATAL_ERROR "Qt6 not found (run scripts/setup.sh)")
  else()
    pipetune_left_out("gui/ (pipetune-gui)" "Qt6 Widgets not found (qt6-base-dev)")
  endif()
else()
  pipetune_left_out("gui/" "PIPETUNE_WITH_QT=OFF")
endif()

function(pipetune_report_features)
  set(_parts "sim" "cli")
  if(PIPETUNE_HAVE_TORCH)
    list(APPEND _parts "executor" "profiler")
  endif()
  if(PIPETUNE_HAVE_GLOO)
    list(APPEND _parts "distributed (gloo)")
  endif()
  if(PIPETUNE_HAVE_CUDA)
    list(APPEND _parts "cuda")
  endif()
  if(PIPETUNE_HAVE_CUPTI)
    list(APPEND _parts "cupti")
  endif()
  if(PIPETUNE_HAVE_QT)
    list(APPEND _parts "gui")
  endif()
  list(JOIN _parts ", " _built)
  message(STATUS "pipetune: building ${_built}")
  foreach(_line IN LISTS PIPETUNE_LEFT_OUT)
    message(STATUS "pipetune: left out ${_line}")
  endforeach()
endfunction()
