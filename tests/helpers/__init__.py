"""Helpers shared by the test suite; import the module you need, e.g.
`from tests.helpers.net import free_port`."""
