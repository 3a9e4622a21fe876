"""Replays on the daemons' engine: the loop, `ctr demo`, `ctr backtest`, their reports."""
