"""The app layer: command line, `run` orchestration, report and inspect. Nothing below imports it."""
