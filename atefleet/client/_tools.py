"""One method per guest tool, written once for `Session` (answers `R` = ToolResult) and
`AsyncSession` (`R` = Awaitable[ToolResult]); arguments are the tools' JSON schemas'."""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

R = TypeVar("R")

Encoding = Literal["utf8", "base64"]


def _args(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


class ToolMethods(Generic[R]):
    def tool(self, name: str, arguments: dict[str, Any]) -> R:
        """Run any tool the environment allows, by name."""
        raise NotImplementedError

    def bash(self, command: str, *, cwd: str | None = None, env: dict[str, str] | None = None,
             timeout_s: float | None = None, background: bool | None = None, stdin: str | None = None) -> R:
        return self.tool("bash", _args(command=command, cwd=cwd, env=env, timeout=timeout_s,
                                       background=background, stdin=stdin))

    def read_file(self, path: str, *, encoding: Encoding | None = None, start_line: int | None = None,
                  end_line: int | None = None, offset: int | None = None, limit: int | None = None) -> R:
        return self.tool("read_file", _args(path=path, encoding=encoding, start_line=start_line,
                                            end_line=end_line, offset=offset, limit=limit))

    def write_file(self, path: str, content: str, *, encoding: Encoding | None = None,
                   mode: str | None = None) -> R:
        return self.tool("write_file", _args(path=path, content=content, encoding=encoding, mode=mode))

    def edit(self, command: Literal["view", "create", "str_replace", "insert", "undo_edit"], path: str, *,
             view_range: list[int] | None = None, file_text: str | None = None, old_str: str | None = None,
             new_str: str | None = None, insert_line: int | None = None) -> R:
        return self.tool("edit", _args(command=command, path=path, view_range=view_range, file_text=file_text,
                                       old_str=old_str, new_str=new_str, insert_line=insert_line))

    def list_dir(self, path: str = ".", *, depth: int | None = None) -> R:
        return self.tool("list_dir", _args(path=path, depth=depth))

    def mkdir(self, path: str, *, parents: bool | None = None, mode: str | None = None) -> R:
        return self.tool("mkdir", _args(path=path, parents=parents, mode=mode))

    def rm(self, path: str, *, recursive: bool | None = None) -> R:
        return self.tool("rm", _args(path=path, recursive=recursive))

    def stat(self, path: str) -> R:
        return self.tool("stat", _args(path=path))

    def process(self, action: Literal["status", "logs", "signal", "kill", "list", "write_stdin"],
                process_id: str | None = None, *, stdout_offset: int | None = None,
                stderr_offset: int | None = None, limit: int | None = None, wait_s: float | None = None,
                signal: str | None = None, data: str | None = None, eof: bool | None = None) -> R:
        return self.tool("process", _args(action=action, process_id=process_id, stdout_offset=stdout_offset,
                                          stderr_offset=stderr_offset, limit=limit, wait=wait_s,
                                          signal=signal, data=data, eof=eof))

    def list_skills(self) -> R:
        return self.tool("list_skills", {})

    def activate_skill(self, name: str) -> R:
        return self.tool("activate_skill", _args(name=name))
