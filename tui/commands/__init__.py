"""Left here for now: `estimate.py`, the `tunedeck estimate` verb and the advice the compose
form's ctrl+t shows (`advice_for`, `speed_flag_lines`). The other verbs are in `tunedeck.cli`;
this one moves there once the compose form's current change has landed."""
