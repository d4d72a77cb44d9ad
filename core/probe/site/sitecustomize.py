"""Injected by tunedeck into training ranks (PYTHONPATH) when run.dataloader_probe is on.

Installs the DataLoader wait probe, then runs any other sitecustomize this one shadows. Never
raises: a probe must not be able to break the user's program.
"""

try:
    from tunedeck.core.probe.dataloader import install as _td_install

    _td_install()
except Exception:
    pass

try:
    from tunedeck.core.probe.dataloader import chain_sitecustomize as _td_chain

    _td_chain(__file__)
except Exception:
    pass

try:
    from tunedeck.core.probe.flight import serve as _td_flight

    _td_flight()
except Exception:
    pass
