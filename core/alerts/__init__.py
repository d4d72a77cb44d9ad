"""Alerts sent by a run's agent, so they reach the user with no TUI attached: a run's end and
its findings, through push services (apprise URLs) and a user command (argv, the alert as
JSON on stdin). `config` says what to send where, `message` what an alert says, `ledger`
what was sent (alerts.json in the run directory: an adopting agent never sends again),
`deliver` sends off the agent's loop, `watch` is what the agent calls."""
