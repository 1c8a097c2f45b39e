"""Import of other agents' session files (pi, Claude Code) into new sessions of the journal."""

from harness.imports.claude_code import import_claude_code_session
from harness.imports.pi import import_pi_session
from harness.imports.plan import ImportReport

__all__ = ["ImportReport", "import_claude_code_session", "import_pi_session"]
