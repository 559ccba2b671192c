"""The model side of a run: GR00T from gr00t_model (`gr00t`), the TrainParts built from the sibling packages (`build`,
`build_mixture`) and the trainer's model component (`component`)."""
