"""A population: N runs of one config trained side by side in one job, in one place.

    driver.py            `Population`: the members (each a `Trainer` over the first member's
                         programs) stepped in lockstep, their checkpoints and resumes;
                         `train(config)` runs a population or a single run
    section.py           the `population` config section: each member's values and config,
                         what a population refuses, `batched()`
    pbt.py               population-based training: when, whom to copy, the perturbations
    batched_update.py    `MemberUpdates`: every member's update as one vmapped program
    batched_sampling.py  `MemberSampler`: every member's rollouts as one vmapped program

docs/population.md describes them.
"""
