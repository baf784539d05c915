/* Runs a program as if on a CPU without some x86-64 extensions: preloaded by scripts/cpu-as.
 *
 * Every library picks its kernels from what the `cpuid` instruction says (ONNX Runtime's MLAS,
 * OpenVINO's oneDNN, OpenCV, x264, numpy, Rust's is_x86_feature_detected). Linux can make
 * `cpuid` fault in user space (arch_prctl ARCH_SET_CPUID, on CPUs with CPUID faulting, KVM
 * guests included): this library turns faulting on in every process and thread it is loaded
 * into, answers each `cpuid` from the SIGSEGV it raises with the real answer minus the
 * extensions the level hides, and steps over the instruction. The code that then runs is the
 * real AVX2 (or AVX-512) code on the real core: speeds are this machine's at that ISA, not an
 * emulator's.
 *
 * CPU_AS=avx2    no AVX-512 (any), no AVX10, no AVX-VNNI, no AMX: a Haswell..Zen 3 class CPU
 * CPU_AS=avx512  no AMX, no AVX-512 FP16, no AVX10: an AVX-512 CPU of before Sapphire Rapids
 * CPU_AS_NOBF16=1 also hides AVX-512 BF16 (with avx512: a Skylake/Cascade Lake class CPU)
 *
 * The program's own SIGSEGV handler (Rust's stack-overflow guard, say) is kept: sigaction and
 * signal are wrapped, so it is called for every fault that is not a `cpuid`. glibc picks its
 * string functions before any library is loaded, so they may still use AVX-512: harmless,
 * they give the same results. A statically linked program (nats-server) sees the real CPU.
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);

static sigaction_fn real_sigaction;
/* The handler the program asked for, called for faults that are not ours. Written before
 * faulting is turned on, and by the program's sigaction calls (its own synchronization). */
static struct sigaction program_handler;
static int active, level_avx2, hide_bf16;

static void bits_off(unsigned *reg, const int *bits, size_t n) {
    for (size_t i = 0; i < n; i++) *reg &= ~(1u << bits[i]);
}

static void masked_cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
    if (leaf == 7 && sub == 0) {
        /* EDX: AVX512_4VNNIW 2, AVX512_4FMAPS 3, VP2INTERSECT 8, AMX_BF16 22, AVX512_FP16 23,
         * AMX_TILE 24, AMX_INT8 25 */
        static const int edx_avx512[] = {22, 23, 24, 25};
        static const int edx_all[] = {2, 3, 8, 22, 23, 24, 25};
        if (level_avx2) {
            /* EBX: F 16, DQ 17, IFMA 21, PF 26, ER 27, CD 28, BW 30, VL 31 */
            static const int ebx[] = {16, 17, 21, 26, 27, 28, 30, 31};
            /* ECX: VBMI 1, VBMI2 6, VNNI 11, BITALG 12, VPOPCNTDQ 14 */
            static const int ecx[] = {1, 6, 11, 12, 14};
            bits_off(&r[1], ebx, sizeof ebx / sizeof *ebx);
            bits_off(&r[2], ecx, sizeof ecx / sizeof *ecx);
            bits_off(&r[3], edx_all, sizeof edx_all / sizeof *edx_all);
        } else {
            bits_off(&r[3], edx_avx512, sizeof edx_avx512 / sizeof *edx_avx512);
        }
    } else if (leaf == 7 && sub == 1) {
        /* EAX: AVX_VNNI 4, AVX512_BF16 5, AMX_FP16 21, AVX_IFMA 23; EDX: AVX_VNNI_INT8 4,
         * AVX_NE_CONVERT 5, AMX_COMPLEX 8, AVX10 19 (AVX10 brings AVX-512 FP16 and, from 10.2,
         * 512-bit vectors on every core: hidden at both levels, with its leaf 0x24) */
        static const int eax_avx2[] = {4, 5, 21, 23};
        static const int eax_avx512[] = {21};
        static const int edx[] = {4, 5, 8};
        if (level_avx2) {
            bits_off(&r[0], eax_avx2, sizeof eax_avx2 / sizeof *eax_avx2);
            bits_off(&r[3], edx, sizeof edx / sizeof *edx);
        } else {
            bits_off(&r[0], eax_avx512, sizeof eax_avx512 / sizeof *eax_avx512);
            bits_off(&r[3], (const int[]){8}, 1);
        }
        r[3] &= ~(1u << 19);
        if (hide_bf16) r[0] &= ~(1u << 5);
    } else if (leaf == 0x24) {
        /* AVX10's version and vector lengths: none. */
        r[0] = r[1] = r[2] = r[3] = 0;
    } else if (leaf == 0xd && sub == 0 && level_avx2) {
        /* The state components the CPU supports: no opmask/ZMM (5-7), no AMX tiles (17-18). */
        r[0] &= ~((7u << 5) | (3u << 17));
    }
}

static void on_segv(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = context;
    greg_t *regs = uc->uc_mcontext.gregs;
    /* A faulting cpuid is a general protection fault: SI_KERNEL, never a page fault, so the
     * instruction bytes are readable. */
    if (info->si_code == SI_KERNEL) {
        const unsigned char *ip = (const unsigned char *)regs[REG_RIP];
        if (ip[0] == 0x0f && ip[1] == 0xa2) {
            unsigned r[4];
            masked_cpuid((unsigned)regs[REG_RAX], (unsigned)regs[REG_RCX], r);
            regs[REG_RAX] = r[0];
            regs[REG_RBX] = r[1];
            regs[REG_RCX] = r[2];
            regs[REG_RDX] = r[3];
            regs[REG_RIP] += 2;
            return;
        }
    }
    struct sigaction h = program_handler;
    if ((h.sa_flags & SA_SIGINFO) && h.sa_sigaction) {
        h.sa_sigaction(sig, info, context);
    } else if (h.sa_handler != SIG_DFL && h.sa_handler != SIG_IGN && h.sa_handler) {
        h.sa_handler(sig);
    } else {
        /* Not ours and no handler: the default action, when the fault repeats on return. */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        real_sigaction(SIGSEGV, &dfl, NULL);
    }
}

int sigaction(int signum, const struct sigaction *act, struct sigaction *old) {
    if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (signum != SIGSEGV || !active) {
        return real_sigaction(signum, act, old);
    }
    if (old) *old = program_handler;
    if (act) program_handler = *act;
    return 0;
}

sighandler_t signal(int signum, sighandler_t handler) {
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    act.sa_flags = SA_RESTART;
    if (sigaction(signum, &act, &old) != 0) return SIG_ERR;
    return old.sa_handler;
}

__attribute__((constructor)) static void start(void) {
    if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    const char *level = getenv("CPU_AS");
    if (!level) return;
    level_avx2 = strcmp(level, "avx2") == 0;
    const char *nobf16 = getenv("CPU_AS_NOBF16");
    hide_bf16 = nobf16 && strcmp(nobf16, "1") == 0;
    memset(&program_handler, 0, sizeof program_handler);
    program_handler.sa_handler = SIG_DFL;
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = on_segv;
    act.sa_flags = SA_SIGINFO;
    sigemptyset(&act.sa_mask);
    real_sigaction(SIGSEGV, &act, &program_handler);
    active = 1;
    if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
        static const char msg[] = "cpu-as: this CPU cannot make cpuid fault; running unmasked\n";
        (void)!write(2, msg, sizeof msg - 1);
    }
}
