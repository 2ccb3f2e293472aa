"""Methods that add a part to several stages: PPO's learned critic and GAE, PACT's expert
traces, step-level credit (GiGPO, 3SPO), self-conditioned log-prob passes."""
