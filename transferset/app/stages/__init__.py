"""`transferset run`'s stages, one module per stage kind (transferset/app/stages/base.py says what a kind
declares); every module here is found and registered when the plan is first built (transferset.runtime.registry)."""
