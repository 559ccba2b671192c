"""The components the Trainer (`_trainer.py`) builds, one module each:

- `data.py`: `DataComponent`, a step's microbatches from the run's BatchSource (and `build_source`: vla-io's
  pipeline or the LeRobot-style baseline, as `optimizations.data` says);
- `model.py`: `ModelComponent`, the model as trained: compiled blocks, data-parallel wrapper, AdamW and the
  gradient-sync plan (`_comm.plan_grad_sync`), lr schedule, the optimizer's side stream, and vla_graph's
  GraphedStep running the step's forward and backward;
- `checkpoint.py`: `CheckpointComponent`, what a checkpoint holds and how a run resumes from one;
- `metrics.py`: `MetricsComponent`, the step timer's records, the host sync of each logging window (global
  loss, non-finite check), metrics.jsonl / TensorBoard / progress bar, the summary and its report;
- `validation.py`: `ValidationComponent`, open-loop action MSE on the held-out episodes next to predicting the
  mean action, every `eval.every` steps, leaving the training trajectory untouched.
"""
