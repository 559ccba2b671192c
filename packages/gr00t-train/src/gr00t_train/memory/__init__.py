"""Device memory of a run before the model is built: the predicted peak (`plan`), the techniques that fit
`memory.budget_gib` (`budget`), the activation model (`activations`) and the measured GPU constants
(`calibration.json`)."""
