"""The output folder of a run: who owns it (`folder`), the lock that says so (`lock`) and the checks made before
anything is written (`checks`)."""
