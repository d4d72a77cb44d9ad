"""Sweeps over the GPU queue: one queued run per point of a grid (or N points drawn from it),
tagged with the sweep's id, at most `parallel` of them live at once (the queue's group
limit, so it holds across agents and reboots), each stopped early by the median rule once
past `median_after` steps (core/stoprule). The sweep file, `$TUNEDECK_HOME/sweeps/<id>.json`,
lists its points and their runs; `table` reads their results."""
