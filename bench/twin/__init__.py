"""The engine twin: a virtual-time vLLM engine with an EAGLE drafter, driving the controller.

`python -m bench twin` (`bench.twin.cli`) replays workloads (`schema.Workload`) on cost
profiles (`schema.Profile`) through every speculation mode (`bench.twin.modes`), the
gateway's `ControlPlane` among them, on the same requests and acceptance draws
(`requests`), in the continuous-batching engine of `engine`; `runner` runs them,
`summary`, `report` and `plots` write the results, `validation` sets the
`cpu-embedded` profile beside the committed real-engine run. A simulation: step
costs come from the profiles, never from a clock.
"""
