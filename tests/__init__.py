"""The test suite, a package so that its shared helpers import by name
(``from tests.op_families import ...``, the repository root being on
pytest's ``pythonpath``), never through sys.path edits."""
