"""Checkpoints: what one holds and how a run resumes from it (`component`), atomic folders and keep-last
(`checkpointer`), files, manifest and write errors (`files`, `manifest`, `save_errors`), background saves
(`staging`, `host_pool`, `async_save`), which tensors are written (`weights`, `base`), resumes at another world
size (`resize`), what a resume may change and whether it can resume (`resume_changes`, `resume_checks`), and a
whole model from one (`restore`, `export`)."""
