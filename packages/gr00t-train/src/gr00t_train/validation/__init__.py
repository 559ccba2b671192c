"""Open-loop validation: the trainer's validation component (`component`), the held-out split and scores (`held_out`)
and `gr00t-train infer` on a checkpoint (`infer`)."""
