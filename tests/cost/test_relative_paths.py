"""A relative --out works (issue 31 item 12): the split row's party files named paths relative to the working
folder, which each party then resolved against its own file's folder (certificate path doubled, exit 3)."""

from __future__ import annotations

from pathlib import Path

import torch

from modelward.core.zoo import ModelConfig, build_model
from modelward.cost.split import write_parties
from modelward.governance.party.config import load_party_config


def test_party_files_written_under_a_relative_folder_resolve_to_existing_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = ModelConfig(arch="entrypoint", entrypoint="modelward.cost.models:square_mlp", kwargs={"hidden": [3]})
    model = build_model(cfg, (4,), 2)
    x = torch.rand(5, 4)
    configs, tls = write_parties(Path("runs/x/split"), model, cfg, (4,), 2, "fc1", x, torch.rand(8, 4),
                                 torch.randint(0, 2, (8,)))
    monkeypatch.chdir(tmp_path / "runs")  # a party is started from anywhere
    for path in configs.values():
        party = load_party_config(path)
        for f in (party.tls.ca, party.tls.cert, party.tls.key, party.init.checkpoint,
                  *(peer.cert for peer in party.peers.values())):
            assert Path(f).is_file(), f
    assert Path(tls.cert).is_absolute() and Path(tls.cert).is_file()
