/* dlsym and dlvsym entry stubs (x86-64). See dlsym.cpp.
 * handle != RTLD_NEXT: tail-jump to the C++ handler.
 * RTLD_NEXT: ask cusnap_dl_next_wants(name); when the shim answers, pass the
 * caller's return address to the C++ emulation; otherwise tail-jump to the C
 * library's function so it sees the original caller. */
#if defined(__x86_64__)
        .text
        .globl  dlsym
        .type   dlsym, @function
dlsym:
        .cfi_startproc
        cmpq    $-1, %rdi
        jne     cusnap_dlsym_handle
        pushq   %rdi
        .cfi_adjust_cfa_offset 8
        pushq   %rsi
        .cfi_adjust_cfa_offset 8
        subq    $8, %rsp
        .cfi_adjust_cfa_offset 8
        movq    %rsi, %rdi
        call    cusnap_dl_next_wants
        addq    $8, %rsp
        .cfi_adjust_cfa_offset -8
        popq    %rsi
        .cfi_adjust_cfa_offset -8
        popq    %rdi
        .cfi_adjust_cfa_offset -8
        testl   %eax, %eax
        jz      1f
        movq    (%rsp), %rdx
        jmp     cusnap_dlsym_next
1:      jmp     *cusnap_real_dlsym_ptr(%rip)
        .cfi_endproc
        .size   dlsym, .-dlsym

        .globl  dlvsym
        .type   dlvsym, @function
dlvsym:
        .cfi_startproc
        cmpq    $-1, %rdi
        jne     cusnap_dlvsym_handle
        pushq   %rdi
        .cfi_adjust_cfa_offset 8
        pushq   %rsi
        .cfi_adjust_cfa_offset 8
        pushq   %rdx
        .cfi_adjust_cfa_offset 8
        movq    %rsi, %rdi
        call    cusnap_dl_next_wants
        popq    %rdx
        .cfi_adjust_cfa_offset -8
        popq    %rsi
        .cfi_adjust_cfa_offset -8
        popq    %rdi
        .cfi_adjust_cfa_offset -8
        testl   %eax, %eax
        jz      1f
        movq    (%rsp), %rcx
        jmp     cusnap_dlvsym_next
1:      jmp     *cusnap_real_dlvsym_ptr(%rip)
        .cfi_endproc
        .size   dlvsym, .-dlvsym
#endif
        .section .note.GNU-stack,"",@progbits
