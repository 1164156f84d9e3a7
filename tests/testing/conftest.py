"""The plugin's own tests run user test files through pytest's `pytester`."""

pytest_plugins = ["pytester"]
