"""Agent-written code, run under kernel-enforced isolation: the parent side (parent), the child (runner), the
bubblewrap command line (isolation) and the kernel walls (seccomp, landlock). docs/security.md says what each level holds."""
