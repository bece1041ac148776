# pagedkv_set_warnings(target): the project's warning flags, for C++ and CUDA sources.
function(pagedkv_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>
    # 2810: nvcc's front end flags every assignment to a [[nodiscard]] class (operator= returns
    # Status&); the host compiler still checks ignored Status results in .cpp files.
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall --expt-relaxed-constexpr -diag-suppress=2810>)
endfunction()
