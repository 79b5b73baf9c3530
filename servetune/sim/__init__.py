"""SIMULATED vLLM: a discrete-event model of its scheduler with a roofline step time.

- :mod:`servetune.sim.profiles`: hardware profiles (published GPU specs, uncalibrated) and model shapes;
- :mod:`servetune.sim.steptime`: the roofline time of one engine step;
- :mod:`servetune.sim.engine`: start-up checks with vLLM's wording, the scheduler, seeded noise.

The daemon's ``sim`` backend (:mod:`daemon.sim_backend`) turns load points into loads for it and
its runs into the same samples a real run records. Importing this package loads no numpy (the
spec validates profile names from :mod:`servetune.sim.profiles`).
"""
