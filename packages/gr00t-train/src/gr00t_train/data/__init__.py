"""The data side of a run: the dataset, processor and pipeline (`dataset`), the features that feed the model
(`features`), what a checkpoint records of the dataset (`fingerprint`), `data.mixture`'s setting and members
(`mixture`, `mixture_data`) and the trainer's data component (`component`)."""
