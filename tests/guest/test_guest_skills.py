"""Skills: progressive disclosure over the sample skill set in tests/guest/skills."""

from __future__ import annotations

from guest_harness import SKILLS_DIR, call

from common.guest_client import GuestClient


async def test_list_gives_names_and_descriptions_only_and_reports_invalid(client: GuestClient) -> None:
    r = await call(client, "list_skills")
    assert [s["name"] for s in r["skills"]] == ["csv-tools", "pdf-processing"]
    assert set(r["skills"][0]) == {"name", "description"}
    assert "Run `scripts/extract.sh" not in r["output"]  # no bodies at this stage
    invalid = {i["directory"]: i["error"] for i in r["invalid"]}
    assert set(invalid) == {"Bad_Name", "wrong-dir", "no-description"}
    assert "lowercase" in invalid["Bad_Name"]
    assert "must equal its directory name" in invalid["wrong-dir"]
    assert "description" in invalid["no-description"]
    assert r["output"].startswith("- csv-tools: Summarise and filter CSV files")


async def test_activate_gives_body_and_bundled_files(client: GuestClient) -> None:
    r = await call(client, "activate_skill", name="pdf-processing")
    assert r["instructions"].startswith("# PDF processing")
    assert r["files"] == [
        f"{SKILLS_DIR}/pdf-processing/reference.md",
        f"{SKILLS_DIR}/pdf-processing/scripts/extract.sh",
    ]
    assert r["output"].endswith("Bundled files:\n" + "\n".join(r["files"]))
    # The bundled files are usable with the other tools (read-only for file tools).
    assert (await call(client, "read_file", path=r["files"][0]))["output"] == "# Table options\n"
    assert (await call(client, "bash", command=f"{r['files'][1]} doc.pdf"))[
        "stdout"
    ] == "extracting doc.pdf\n"
    w = await call(client, "write_file", path=r["files"][0], content="x")
    assert w["is_error"] and "outside the workspace" in w["error"]


async def test_activate_errors(client: GuestClient) -> None:
    assert "not available" in (await call(client, "activate_skill", name="wrong-dir"))["error"]
    assert "no skill named" in (await call(client, "activate_skill", name="absent"))["error"]
    assert "not a valid skill name" in (await call(client, "activate_skill", name="../etc"))["error"]
    assert "'name'" in (await call(client, "activate_skill"))["error"]


async def test_per_call_skills_dir_and_missing_dir(client: GuestClient) -> None:
    result, _ = await client.run("skills-missing-dir", "list_skills", {}, skills_dir="/nonexistent/skills")
    assert result["output"] == "No skills available."
