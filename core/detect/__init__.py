"""Live detectors the agent runs on the event stream (and telemetry when it has any):
dataloader starvation, stalls and stragglers. Each has update(events) and check(now) ->
list[Finding]; each reports an episode once, and again only after it recovered."""
