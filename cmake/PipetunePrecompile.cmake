# Precompiled LibTorch headers. A file built on LibTorch spends about 5 of its 8-18 s of compile
# time (-O2, a 2-core VM like CI's) parsing ATen's headers, the same in every file; a target
# that precompiles them parses them once (17 s). Worth it only for targets with many such files:
# the model and executor libraries and the executor tests, 26-28 % less compile CPU each
# (docs/reliability.md, "CI's budget"). -DPIPETUNE_PCH=OFF builds without, e.g. to check that
# every file includes what it uses, which a precompiled header hides.
option(PIPETUNE_PCH "Precompile LibTorch's ATen header in the targets built on it" ON)

# Every source of `target` gets <ATen/ATen.h> first, from one precompiled copy per target.
function(pipetune_precompile_torch target)
  if(PIPETUNE_PCH)
    target_precompile_headers(${target} PRIVATE <ATen/ATen.h>)
  endif()
endfunction()
