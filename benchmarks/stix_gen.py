"""A seeded STIX 2.1-like batch: 24,772 objects of 16 types (~15 MB), and its ``idem.yaml``.

    python benchmarks/stix_gen.py --out stix.ndjson [--count 24772] [--seed 2472] [--config idem.yaml]

Why: the threat-feed benchmarks have three flat record types. A real threat-intel
export (an OpenCTI or MISP bundle) is many record types in one batch, most of them
small relationships, with nested arrays of objects (external references, kill-chain
phases), long free text in many scripts, and cross-references by id. This generator
makes a batch of that shape, the same bytes for the same seed, so "16 tables in one
commit" can be measured: every type is its own table, so one batch fans out into 16
staging tables and 16 inserts in the applying transaction.

Every field a type uses is declared in the catalog ``tables()`` returns, so the
measured run never widens a table (schema evolution is measured elsewhere).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

COUNT = 24_772
SEED = 2472
# The share of each type, roughly that of a MITRE ATT&CK / OpenCTI export: relationships first.
WEIGHTS: dict[str, float] = {
    "relationship": 0.45,
    "indicator": 0.16,
    "malware": 0.05,
    "observed-data": 0.05,
    "vulnerability": 0.03,
    "attack-pattern": 0.03,
    "course-of-action": 0.03,
    "identity": 0.03,
    "infrastructure": 0.03,
    "sighting": 0.03,
    "threat-actor": 0.02,
    "intrusion-set": 0.02,
    "location": 0.02,
    "report": 0.02,
    "campaign": 0.015,
    "tool": 0.015,
}
COMMON: dict[str, Any] = {
    "spec_version": "string",
    "created": "timestamp",
    "modified": "timestamp",
    "created_by_ref": "string",
    "revoked": "bool",
    "labels": "dynamic",
    "confidence": "int",
    "lang": "string",
    "external_references": "dynamic",
    "object_marking_refs": "dynamic",
}
NAMED: dict[str, Any] = {"name": {"type": "string", "required": True}, "description": "string"}
SEEN = {"first_seen": "timestamp", "last_seen": "timestamp"}
SPECIFIC: dict[str, dict[str, Any]] = {
    "indicator": {
        "name": "string", "description": "string",
        "pattern": {"type": "string", "required": True}, "pattern_type": "string", "pattern_version": "string",
        "valid_from": {"type": "timestamp", "required": True}, "valid_until": "timestamp",
        "indicator_types": "dynamic", "kill_chain_phases": "dynamic",
    },
    "malware": {
        **NAMED, **SEEN, "is_family": {"type": "bool", "required": True}, "malware_types": "dynamic",
        "aliases": "dynamic", "capabilities": "dynamic", "implementation_languages": "dynamic",
        "architecture_execution_envs": "dynamic", "kill_chain_phases": "dynamic",
    },
    "threat-actor": {
        **NAMED, **SEEN, "threat_actor_types": "dynamic", "aliases": "dynamic", "roles": "dynamic",
        "goals": "dynamic", "sophistication": "string", "resource_level": "string",
        "primary_motivation": "string", "secondary_motivations": "dynamic",
    },
    "attack-pattern": {
        **NAMED, "aliases": "dynamic", "kill_chain_phases": "dynamic", "x_mitre_platforms": "dynamic",
        "x_mitre_detection": "string", "x_mitre_version": "string", "x_mitre_is_subtechnique": "bool",
    },
    "campaign": {**NAMED, **SEEN, "aliases": "dynamic", "objective": "string"},
    "course-of-action": {**NAMED, "x_mitre_deprecated": "bool"},
    "identity": {**NAMED, "identity_class": "string", "sectors": "dynamic", "contact_information": "string", "roles": "dynamic"},
    "infrastructure": {**NAMED, **SEEN, "infrastructure_types": "dynamic", "aliases": "dynamic", "kill_chain_phases": "dynamic"},
    "intrusion-set": {
        **NAMED, **SEEN, "aliases": "dynamic", "goals": "dynamic", "resource_level": "string",
        "primary_motivation": "string", "secondary_motivations": "dynamic",
    },
    "location": {
        "name": "string", "description": "string", "region": "string", "country": "string",
        "administrative_area": "string", "city": "string", "street_address": "string",
        "postal_code": "string", "latitude": "real", "longitude": "real", "precision": "real",
    },
    "observed-data": {
        "first_observed": {"type": "timestamp", "required": True},
        "last_observed": {"type": "timestamp", "required": True},
        "number_observed": {"type": "long", "required": True}, "object_refs": "dynamic",
    },
    "report": {
        **NAMED, "report_types": "dynamic", "published": {"type": "timestamp", "required": True},
        "object_refs": {"type": "dynamic", "required": True},
    },
    "tool": {**NAMED, "tool_types": "dynamic", "aliases": "dynamic", "tool_version": "string", "kill_chain_phases": "dynamic"},
    "vulnerability": {**NAMED, "x_cvss_score": "real", "x_cvss_vector": "string", "x_epss": "real"},
    "relationship": {
        "relationship_type": {"type": "string", "required": True}, "description": "string",
        "source_ref": {"type": "string", "required": True}, "target_ref": {"type": "string", "required": True},
        "start_time": "timestamp", "stop_time": "timestamp",
    },
    "sighting": {
        "description": "string", **SEEN, "sighting_of_ref": {"type": "string", "required": True},
        "observed_data_refs": "dynamic", "where_sighted_refs": "dynamic", "count": "int", "summary": "bool",
    },
}
# Free text in several scripts: Latin with diacritics, Cyrillic, Greek, CJK, Arabic, emoji,
# and the characters JSON and COPY must escape (quote, backslash, tab, line separator).
WORDS = (
    "the actor used spear-phishing emails with malicious attachments to deliver a loader "
    "that establishes persistence through scheduled tasks and exfiltrates credentials over HTTPS "
    "campaign targeting energy finance government healthcare sectors in several regions "
    "Überwachung Schadsoftware Angriff café résumé naïve São Paulo Kraków Zürich "
    "шпионаж вредоносный кампания группировка αρχείο επίθεση 攻撃 マルウェア 恶意软件 间谍 "
    "حملة برمجيات 🐻 🔐 \"quoted\" back\\slash tab\there line\u2028sep"
).split(" ")
TLP = [
    "marking-definition--613f2e26-407d-48c7-9eca-b8e91df99dc9",  # TLP:WHITE/CLEAR
    "marking-definition--34098fce-860f-48ae-8e50-ebd3cc5e41da",  # TLP:GREEN
    "marking-definition--f88d31f6-486f-44da-b317-01333bde0b82",  # TLP:AMBER
]
PHASES = ["reconnaissance", "resource-development", "initial-access", "execution", "persistence",
          "privilege-escalation", "defense-evasion", "credential-access", "discovery", "lateral-movement",
          "collection", "command-and-control", "exfiltration", "impact"]
SOURCES = ["mitre-attack", "cve", "capec", "misp", "opencti", "alienvault", "virustotal", "abuse.ch"]
T0 = datetime(2015, 1, 1, tzinfo=UTC)


def tables() -> dict[str, dict[str, Any]]:
    """The catalog (``tables:`` of idem.yaml) of the 16 types: common properties + each type's own."""
    return {kind: {"columns": {**COMMON, **SPECIFIC[kind]}} for kind in WEIGHTS}


def config(drop: str = "drop", connector: str = "stix") -> dict[str, Any]:
    """An ``idem.yaml`` (as a dict) with one file-drop connector routing on ``type``."""
    return {
        "connectors": [
            {"name": connector, "kind": "filedrop", "path": drop, "record_type_field": "type", "id_field": "id"}
        ],
        "tables": tables(),
        "spark": {"conf": {"spark.ui.enabled": "false"}},
    }


def counts(total: int = COUNT) -> dict[str, int]:
    """Objects per type for ``total`` objects (rounding goes to relationships)."""
    out = {kind: int(total * weight) for kind, weight in WEIGHTS.items()}
    out["relationship"] += total - sum(out.values())
    return out


class _Maker:
    """Objects of each type from one seeded random stream; ids are drawn first so refs resolve."""

    def __init__(self, rng: random.Random, ids: dict[str, list[str]]) -> None:
        self.rng = rng
        self.ids = ids
        self.identities = ids["identity"][:50] or ["identity--00000000-0000-4000-8000-000000000000"]

    def stamp(self, after: datetime | None = None) -> str:
        base = after or T0
        moment = base + timedelta(seconds=self.rng.randrange(3 * 365 * 86400), milliseconds=self.rng.randrange(1000))
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"

    def text(self, low: int, high: int) -> str:
        words = self.rng.choices(WORDS, k=self.rng.randint(low, high))
        return " ".join(words).capitalize() + "."

    def some(self, pool: list[str], low: int, high: int) -> list[str]:
        return self.rng.sample(pool, min(len(pool), self.rng.randint(low, high)))

    def refs(self, kinds: list[str], low: int, high: int) -> list[str]:
        pool = [i for kind in kinds for i in self.ids[kind][:400]]
        return self.some(pool, low, high)

    def external_references(self, kind: str, low: int = 0, high: int = 3) -> list[dict[str, Any]]:
        out = []
        for _ in range(self.rng.randint(low, high)):
            source = self.rng.choice(SOURCES)
            ref: dict[str, Any] = {"source_name": source, "url": f"https://{source}.example/{kind}/{self.rng.getrandbits(32):08x}"}
            if self.rng.random() < 0.6:
                ref["external_id"] = f"T{self.rng.randrange(1000, 1700)}" if source == "mitre-attack" else f"{source.upper()}-{self.rng.randrange(10**6)}"
            if self.rng.random() < 0.3:
                ref["description"] = self.text(4, 12)
            out.append(ref)
        return out

    def kill_chain(self) -> list[dict[str, str]]:
        return [{"kill_chain_name": "mitre-attack", "phase_name": p} for p in self.some(PHASES, 1, 2)]

    def common(self, kind: str, ident: str) -> dict[str, Any]:
        created = self.stamp()
        obj: dict[str, Any] = {
            "type": kind,
            "spec_version": "2.1",
            "id": ident,
            "created": created,
            "modified": self.stamp(datetime.fromisoformat(created.replace("Z", "+00:00"))),
        }
        if self.rng.random() < 0.5:
            obj["created_by_ref"] = self.rng.choice(self.identities)
        if self.rng.random() < 0.4:
            obj["object_marking_refs"] = [self.rng.choice(TLP)]
        if self.rng.random() < 0.3:
            obj["labels"] = self.some(["malicious-activity", "apt", "ransomware", "phishing", "c2", "botnet", "espionage"], 1, 3)
        if self.rng.random() < 0.5:
            obj["confidence"] = self.rng.randrange(0, 101)
        if self.rng.random() < 0.1:
            obj["lang"] = self.rng.choice(["en", "de", "ru", "ja", "zh", "ar"])
        if self.rng.random() < 0.02:
            obj["revoked"] = True
        return obj

    def make(self, kind: str, ident: str) -> dict[str, Any]:
        """One object: the common properties, then its type's own. The random draws happen in a
        fixed order (common, name, then the type's), which is what keeps a seed's bytes the same."""
        rng = self.rng
        obj = self.common(kind, ident)
        name = f"{kind.replace('-', ' ').title()} {rng.choice(WORDS)} {rng.randrange(10000)}"
        if kind == "relationship":
            self.relationship(obj)
        elif kind == "indicator":
            self.indicator(obj, name)
        elif kind == "observed-data":
            self.observed_data(obj)
        elif kind == "sighting":
            self.sighting(obj)
        elif kind == "location":
            self.location(obj)
        elif kind == "report":
            self.report(obj, name)
        else:
            self.named(obj, kind, name)
        return obj

    def relationship(self, obj: dict[str, Any]) -> None:
        """The most common type: two refs into the pools, rarely a description or a reference."""
        rng = self.rng
        obj["relationship_type"] = rng.choice(["uses", "indicates", "mitigates", "targets", "attributed-to", "related-to", "variant-of"])
        obj["source_ref"] = rng.choice(self.ids[rng.choice(["indicator", "malware", "threat-actor", "intrusion-set", "campaign"])])
        obj["target_ref"] = rng.choice(self.ids[rng.choice(["attack-pattern", "malware", "vulnerability", "identity", "location", "tool"])])
        if rng.random() < 0.15:
            obj["description"] = self.text(3, 12)
        if rng.random() < 0.2:
            obj["start_time"] = self.stamp()
        if rng.random() < 0.1:
            obj["external_references"] = self.external_references("relationship", 1, 1)

    def indicator(self, obj: dict[str, Any], name: str) -> None:
        """A pattern over one of four observable kinds (an address, a domain, a hash, a URL)."""
        rng = self.rng
        value = rng.choice([
            f"[ipv4-addr:value = '{rng.randrange(1, 224)}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}']",
            f"[domain-name:value = 'cdn-{rng.getrandbits(24):06x}.example']",
            f"[file:hashes.'SHA-256' = '{rng.getrandbits(256):064x}']",
            f"[url:value = 'https://login-{rng.getrandbits(16):04x}.example/päth?q=ü']",
        ])
        obj.update(name=name, pattern=value, pattern_type="stix", pattern_version="2.1", valid_from=self.stamp(),
                   indicator_types=self.some(["malicious-activity", "anomalous-activity", "attribution", "compromised"], 1, 2),
                   kill_chain_phases=self.kill_chain(), description=self.text(1, 6))
        if rng.random() < 0.4:
            obj["valid_until"] = self.stamp(datetime(2025, 1, 1, tzinfo=UTC))
        obj["external_references"] = self.external_references("indicator", 0, 1)

    def observed_data(self, obj: dict[str, Any]) -> None:
        """A count of observations, with refs to the indicators and infrastructure seen."""
        rng = self.rng
        first = self.stamp()
        obj.update(first_observed=first, last_observed=first, number_observed=rng.randrange(1, 10**6),
                   object_refs=self.refs(["indicator", "infrastructure"], 1, 6))

    def sighting(self, obj: dict[str, Any]) -> None:
        """An indicator seen: refs to it, to observed data, and to where it was seen."""
        rng = self.rng
        obj.update(sighting_of_ref=rng.choice(self.ids["indicator"]), count=rng.randrange(1, 500),
                   observed_data_refs=self.refs(["observed-data"], 1, 3), where_sighted_refs=self.refs(["identity", "location"], 1, 2),
                   first_seen=self.stamp(), summary=rng.random() < 0.1, description=self.text(2, 8))

    def location(self, obj: dict[str, Any]) -> None:
        """Place names in several scripts, and real-valued coordinates."""
        rng = self.rng
        obj.update(name=rng.choice(["São Paulo", "Kraków", "Zürich", "Москва", "東京", "القاهرة", "Reykjavík", "Ōsaka"]),
                   region=rng.choice(["europe", "eastern-asia", "south-america", "northern-africa"]),
                   country=rng.choice(["BR", "PL", "CH", "RU", "JP", "EG", "IS"]),
                   city=rng.choice(["São Paulo", "Kraków", "Zürich", "Москва", "東京"]),
                   latitude=round(rng.uniform(-90, 90), 6), longitude=round(rng.uniform(-180, 180), 6),
                   precision=round(rng.uniform(10, 10_000), 1), description=self.text(2, 10))

    def report(self, obj: dict[str, Any], name: str) -> None:
        """The largest objects: long text and many refs to other types."""
        obj.update(name=name, description=self.text(8, 30), published=self.stamp(),
                   report_types=self.some(["threat-report", "attack-pattern", "campaign", "indicator"], 1, 2),
                   object_refs=self.refs(["indicator", "malware", "threat-actor", "attack-pattern", "relationship", "vulnerability"], 4, 16),
                   external_references=self.external_references("report", 1, 3))

    def named(self, obj: dict[str, Any], kind: str, name: str) -> None:
        """The SDOs with a name and description (malware, actors, tools...), then each one's own."""
        rng = self.rng
        obj.update(name=name, description=self.text(2, 10), external_references=self.external_references(kind, 0, 2))
        if kind == "malware":
            self.malware(obj, name)
        elif kind in ("threat-actor", "intrusion-set"):
            self.actor(obj, kind)
        elif kind == "attack-pattern":
            obj.update(kill_chain_phases=self.kill_chain(), x_mitre_platforms=self.some(["Windows", "Linux", "macOS", "Azure AD", "SaaS"], 1, 4),
                       x_mitre_detection=self.text(3, 12), x_mitre_version=f"{rng.randrange(1, 4)}.{rng.randrange(3)}",
                       x_mitre_is_subtechnique=rng.random() < 0.5)
        elif kind == "campaign":
            obj.update(aliases=[name + " ζ"], first_seen=self.stamp(), last_seen=self.stamp(), objective=self.text(5, 20))
        elif kind == "course-of-action":
            obj["x_mitre_deprecated"] = rng.random() < 0.05
        elif kind == "identity":
            obj.update(identity_class=rng.choice(["organization", "individual", "class"]),
                       sectors=self.some(["energy", "financial-services", "government-national", "healthcare"], 1, 2),
                       contact_information=f"soc+{rng.randrange(1000)}@example.org; Tel. +49 {rng.randrange(10**8)}")
        elif kind == "infrastructure":
            obj.update(infrastructure_types=self.some(["command-and-control", "botnet", "hosting-malware", "phishing"], 1, 2),
                       first_seen=self.stamp(), kill_chain_phases=self.kill_chain())
        elif kind == "tool":
            obj.update(tool_types=self.some(["remote-access", "credential-exploitation", "network-capture"], 1, 2),
                       tool_version=f"{rng.randrange(1, 9)}.{rng.randrange(20)}", kill_chain_phases=self.kill_chain())
        elif kind == "vulnerability":
            obj["name"] = f"CVE-{rng.randrange(2015, 2026)}-{rng.randrange(1000, 60000)}"
            obj.update(x_cvss_score=round(rng.uniform(0, 10), 1), x_epss=round(rng.random(), 5),
                       x_cvss_vector=f"CVSS:3.1/AV:{rng.choice('NALP')}/AC:{rng.choice('LH')}/PR:{rng.choice('NLH')}/UI:{rng.choice('NR')}")

    def malware(self, obj: dict[str, Any], name: str) -> None:
        """Families and samples, with aliases in several scripts and list-valued properties."""
        rng = self.rng
        obj.update(is_family=rng.random() < 0.7, malware_types=self.some(["ransomware", "trojan", "backdoor", "dropper", "worm", "spyware"], 1, 3),
                   aliases=[f"{name} {s}" for s in self.some(["α", "β", "Gen", "v2", "Лоадер"], 0, 3)],
                   first_seen=self.stamp(), capabilities=self.some(["exfiltrates-data", "persists-after-system-reboot", "communicates-with-c2", "evades-av"], 1, 3),
                   implementation_languages=self.some(["c", "c++", "go", "rust", "python", "powershell"], 1, 2),
                   architecture_execution_envs=self.some(["x86", "x86-64", "arm"], 1, 2), kill_chain_phases=self.kill_chain())

    def actor(self, obj: dict[str, Any], kind: str) -> None:
        """Threat actors and intrusion sets share their motives; actors also get types and roles."""
        rng = self.rng
        obj.update(aliases=[f"{w} {rng.choice(['Bear', 'Panda', 'Kitten', 'Спайдер', '熊猫'])}" for w in self.some(["Fancy", "Cozy", "Wicked", "Velvet"], 1, 3)],
                   goals=[self.text(3, 8) for _ in range(rng.randint(1, 3))], first_seen=self.stamp(),
                   resource_level=rng.choice(["government", "organization", "team"]),
                   primary_motivation=rng.choice(["espionage", "financial-gain", "ideology"]),
                   secondary_motivations=self.some(["dominance", "notoriety", "revenge"], 0, 2))
        if kind == "threat-actor":
            obj.update(threat_actor_types=self.some(["nation-state", "crime-syndicate", "hacker"], 1, 2),
                       roles=self.some(["agent", "director", "sponsor"], 1, 2), sophistication=rng.choice(["advanced", "expert", "strategic"]))


def stix_objects(total: int = COUNT, *, seed: int = SEED) -> Iterator[dict[str, Any]]:
    """``total`` STIX-like objects, the types mixed in a seeded order (as exports interleave them)."""
    rng = random.Random(seed)
    per_type = counts(total)
    ids = {kind: [f"{kind}--{uuid.UUID(int=rng.getrandbits(128), version=4)}" for _ in range(n)] for kind, n in per_type.items()}
    order = [(kind, ident) for kind, idents in ids.items() for ident in idents]
    rng.shuffle(order)
    maker = _Maker(rng, ids)
    for kind, ident in order:
        yield maker.make(kind, ident)


def write_stix(path: Path, total: int = COUNT, *, seed: int = SEED) -> dict[str, Any]:
    """Write the batch as NDJSON (UTF-8, non-ASCII as is) and return its shape."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kinds: Counter[str] = Counter()
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        for obj in stix_objects(total, seed=seed):
            kinds[obj["type"]] += 1
            handle.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))
            handle.write("\n")
    temporary.replace(path)
    return {"file": str(path), "objects": total, "types": dict(sorted(kinds.items())), "bytes": path.stat().st_size, "seed": seed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the NDJSON file to write")
    parser.add_argument("--count", type=int, default=COUNT)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--config", help="also write an idem.yaml for it here (drop directory beside it)")
    args = parser.parse_args()
    shape = write_stix(Path(args.out), args.count, seed=args.seed)
    if args.config:
        Path(args.config).write_text(yaml.safe_dump(config(), sort_keys=False), encoding="utf-8")
    print(json.dumps(shape))
    return 0


if __name__ == "__main__":
    sys.exit(main())
