"""One run over many nodes: the roster (which host runs which node), the ssh transport, the
remote side that starts a node's agent and streams its records back, the head's links that
receive them, and the Slurm batch script.

No daemon and no listening port of tunedeck's own: the head reaches each node with the
user's `ssh` (their keys, ProxyJump, ControlMaster), the ranks meet through torchrun's c10d
rendezvous, and a node's logs, events, state and telemetry come back as framed lines on that
ssh connection's stdout (tunedeck.core.nodes.wire).
"""
