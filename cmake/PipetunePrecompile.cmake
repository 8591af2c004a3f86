# Precompiled LibTorch headers. A file built on LibTorch spends about 5 of its 8-18 s of compile
# time (-O2, a 2-core VM like CI's) parsing ATen's headers, the same in every file; a target
# that precompiles them parses them once (17 s). Worth it only for targets with many such files:
# the model and executor libraries, the CLI's LibTorch commands and the executor tests, 26-28 %
# less compile CPU each (docs/reliability.md, "CI's budget"). -DPIPETUNE_PCH=OFF builds without,
# e.g. to check that every file includes what it uses, which a precompiled header hides.
option(PIPETUNE_PCH "Precompile LibTorch's ATen header in the targets built on it" ON)

# Every source of `target` gets <ATen/ATen.h> first. One precompiled copy serves every target of
# a GROUP: the copy is about 400 MB with line tables, so one per target made four per tree, and
# a CI run's three trees ran a disk of 5 GB free out of room. A group's targets must compile with
# the same optimization level and position-independence, or GCC refuses the copy (-Winvalid-pch
# says so) and parses the header again: the first target of a group builds the copy and the
# others reuse it (`REUSE_FROM`).
function(pipetune_precompile_torch target group)
  if(NOT PIPETUNE_PCH)
    return()
  endif()
  get_property(owner GLOBAL PROPERTY PIPETUNE_TORCH_PCH_${group})
  if(owner)
    target_precompile_headers(${target} REUSE_FROM ${owner})
  else()
    target_precompile_headers(${target} PRIVATE <ATen/ATen.h>)
    set_property(GLOBAL PROPERTY PIPETUNE_TORCH_PCH_${group} ${target})
  endif()
endfunction()
