"""What a run records and reports: the trainer's metrics component (`component`), per-step records and the summary
(`records`), step phase timing (`timing`), start-up phases (`startup`), end-of-run plots (`plots`) and the kernel-
time profile (`profile`)."""
