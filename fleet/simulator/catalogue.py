"""The seeded catalogue of offers: what the simulated marketplace lists, and what it hides (figures from
docs/field-notes.md, "Hosts"; docs/fleet.md, "fleet/simulator/catalogue.py")."""

import random
from dataclasses import dataclass, field

HOURS_PER_MONTH = 30 * 24  # storage_cost is $/GB/month; vast.ai bills it per second over a 30-day month


@dataclass(frozen=True)
class GpuModel:
    name: str
    gpu_ram_mb: int
    compute_cap: int  # x100, as vast.ai lists it: 900 = sm_90
    tflops: float  # per GPU, as total_flops counts them
    dlperf: float  # per GPU
    cheap_usd_per_gpu_hour: tuple[float, float]
    premium_usd_per_gpu_hour: tuple[float, float]
    min_driver_branch: int  # Blackwell needs 570+
    weight: int  # share of the catalogue
    gpu_counts: tuple[int, ...]  # drawn uniformly, so repeats make a count likelier


GPU_MODELS = (
    GpuModel("RTX PRO 6000 WS", 97887, 1200, 126.0, 118.0, (1.00, 1.23), (1.90, 2.50), 570, 30, (1, 1, 1, 2, 2, 4, 8)),
    GpuModel("RTX PRO 6000 S", 97887, 1200, 120.0, 112.0, (1.02, 1.23), (1.90, 2.40), 570, 8, (1, 2, 4, 8)),
    GpuModel("H100 SXM", 81559, 900, 67.0, 135.0, (1.55, 1.95), (2.20, 2.90), 535, 18, (1, 1, 2, 4, 8, 8)),
    GpuModel("H100 NVL", 95830, 900, 60.0, 125.0, (1.50, 1.90), (2.10, 2.70), 535, 10, (1, 2, 4, 8)),
    GpuModel("H200", 143771, 900, 67.0, 150.0, (1.20, 1.60), (2.10, 2.93), 535, 18, (1, 1, 2, 4, 8, 8)),
    GpuModel("H200 NVL", 143771, 900, 60.0, 140.0, (1.25, 1.70), (2.10, 2.80), 550, 8, (1, 2, 4, 8)),
    GpuModel("B200", 183359, 1000, 80.0, 230.0, (3.80, 4.40), (4.60, 5.20), 570, 8, (1, 2, 4, 8, 8)),
    GpuModel("A100 SXM4", 81920, 800, 19.5, 70.0, (0.70, 1.00), (1.20, 1.60), 525, 12, (1, 1, 2, 4, 8)),
    GpuModel("A100 PCIE", 40960, 800, 19.5, 60.0, (0.40, 0.65), (0.80, 1.10), 525, 8, (1, 1, 2, 4)),
)

# (driver_version, cuda_max_good): the newest CUDA each driver branch runs.
DRIVERS = (
    ("525.147.05", 12.0),
    ("535.183.01", 12.2),
    ("535.230.02", 12.2),
    ("550.127.05", 12.4),
    ("550.144.03", 12.4),
    ("560.35.03", 12.6),
    ("570.124.06", 12.8),
    ("570.133.20", 12.8),
    ("570.172.08", 12.8),
    ("575.57.08", 12.9),
    ("580.65.06", 13.0),
    ("580.82.07", 13.0),
)

EUROPE = ("Sweden, SE", "Norway, NO", "Finland, FI", "Germany, DE", "Netherlands, NL", "France, FR", "Poland, PL",
          "Czechia, CZ", "Spain, ES", "United Kingdom, GB", "Iceland, IS")
NORTH_AMERICA = ("US-CA, US", "US-TX, US", "US-VA, US", "US-WA, US", "US-NY, US", "US-OR, US", "US-GA, US",
                 "Quebec, CA", "Ontario, CA")
ELSEWHERE = ("Japan, JP", "Taiwan, TW", "Australia, AU", "Singapore, SG", "Brazil, BR")

CPU_NAMES = ("AMD EPYC 7B13", "AMD EPYC 9454", "AMD EPYC 9654", "Intel Xeon Platinum 8480+", "AMD Ryzen 9 7950X",
             "Intel Xeon Gold 6448Y")
CPU_GHZ = {"AMD EPYC 7B13": 2.45, "AMD EPYC 9454": 2.75, "AMD EPYC 9654": 2.4, "Intel Xeon Platinum 8480+": 2.0,
           "AMD Ryzen 9 7950X": 4.5, "Intel Xeon Gold 6448Y": 2.1}
# GB/s between the GPUs of one machine where they sit on NVLink (SXM and NVL boards); PCIe cards list 0.
NVLINK_GB_S = {"H100 SXM": 900.0, "H100 NVL": 600.0, "H200": 900.0, "H200 NVL": 900.0, "B200": 1800.0,
               "A100 SXM4": 600.0}
# Each card's memory bandwidth (GB/s, as its maker lists it; a host's measured gpu_mem_bw comes out a little under)
# and power limit (W).
MEM_BW_GB_S = {"RTX PRO 6000 WS": 1792.0, "RTX PRO 6000 S": 1597.0, "H100 SXM": 3350.0, "H100 NVL": 3900.0,
               "H200": 4800.0, "H200 NVL": 4800.0, "B200": 8000.0, "A100 SXM4": 2039.0, "A100 PCIE": 1555.0}
MAX_POWER_W = {"RTX PRO 6000 WS": 600.0, "RTX PRO 6000 S": 600.0, "H100 SXM": 700.0, "H100 NVL": 400.0,
               "H200": 700.0, "H200 NVL": 600.0, "B200": 1000.0, "A100 SXM4": 400.0, "A100 PCIE": 250.0}
UBUNTU_VERSIONS = ("20.04", "22.04", "22.04", "24.04")
MOBOS = ("SUPERMICRO H13SSL-N", "ASUS KRPA-U16", "GIGABYTE MZ73-LM0", "SUPERMICRO X13DEG-OAD")
MAX_RENTAL_S = 30 * 24 * 3600.0  # `duration`: how long the host lists the machine for


@dataclass
class Offer:
    """One machine for rent: the listing fields vast.ai shows, and the simulation's hidden truths about the host."""

    id: int
    machine_id: int
    host_id: int
    gpu: GpuModel
    num_gpus: int
    dph_base: float  # on-demand $/h for the machine, without disk
    min_bid: float  # lowest accepted interruptible $/h
    storage_cost: float  # $/GB/month
    inet_up_cost: float  # $/GB
    inet_down_cost: float  # $/GB
    disk_space: float  # GB free for rent
    inet_up: float  # Mb/s, as advertised (measured from the host's own network)
    inet_down: float
    reliability: float
    reliability2: float
    verified: bool
    geolocation: str
    driver_version: str
    cuda_max_good: float
    dlperf: float
    cpu_name: str
    cpu_cores: int
    cpu_ram_mb: int
    disk_bw_mbps: float
    hosting_type: int  # 1 = datacenter, 0 = home or small host
    # Hidden: never listed.
    dies_after_s: float | None = None  # the host dies this many simulated seconds after a rent
    effective_inet_up_mbps: float = 0.0  # what uploads to a distant bucket really get
    gone: bool = False  # removed from the market (host died, or a fault took it away)
    rented_by: int | None = field(default=None)  # instance id while rented

    def host_facts(self) -> dict:
        """What the listing says of the host beyond the seeded draw: drawn from the offer's own id, so the seeded
        catalogue (and every figure tests know it by) stays as it was."""
        rng = random.Random(self.id)
        return {
            "gpu_mem_bw": round(MEM_BW_GB_S[self.gpu.name] * rng.uniform(0.86, 0.97), 1),
            "gpu_max_power": MAX_POWER_W[self.gpu.name] * (rng.choice((1.0, 1.0, 1.0, 0.8)) if self.hosting_type == 0
                                                           else 1.0),
            "gpu_max_temp": float(rng.choice((83, 85, 87, 90))),
            "os_version": rng.choice(UBUNTU_VERSIONS),
            "vms_enabled": self.hosting_type == 1 and rng.random() < 0.4,
            "mobo_name": rng.choice(MOBOS),
        }

    def listing(self, *, is_bid: bool = False, allocated_storage_gb: float = 5.0) -> dict:
        """The offer as vast.ai's search returns it; bid searches price the machine at its minimum bid."""
        dph = self.min_bid if is_bid else self.dph_base
        storage_per_hour = self.storage_cost * allocated_storage_gb / HOURS_PER_MONTH
        dph_total = dph + storage_per_hour
        total_flops = round(self.gpu.tflops * self.num_gpus, 1)
        pci_gen = 5.0 if self.gpu.compute_cap >= 1000 else 4.0
        return {
            "id": self.id,
            "ask_contract_id": self.id,
            "machine_id": self.machine_id,
            "host_id": self.host_id,
            "gpu_name": self.gpu.name,
            "num_gpus": self.num_gpus,
            "gpu_ram": self.gpu.gpu_ram_mb,
            "gpu_total_ram": self.gpu.gpu_ram_mb * self.num_gpus,
            "compute_cap": self.gpu.compute_cap,
            "cuda_max_good": self.cuda_max_good,
            "driver_version": self.driver_version,
            "disk_space": self.disk_space,
            "disk_bw": self.disk_bw_mbps,
            "inet_up": self.inet_up,
            "inet_down": self.inet_down,
            "inet_up_cost": self.inet_up_cost,
            "inet_down_cost": self.inet_down_cost,
            "storage_cost": self.storage_cost,
            "storage_total_cost": round(storage_per_hour, 6),
            "dph_base": round(dph, 4),
            "dph_total": round(dph_total, 4),
            "min_bid": round(self.min_bid, 4),
            "reliability": self.reliability,
            "reliability2": self.reliability2,
            "verified": self.verified,
            "rentable": True,
            "rented": False,
            "external": False,
            "is_bid": is_bid,
            "geolocation": self.geolocation,
            "dlperf": self.dlperf,
            "dlperf_per_dphtotal": round(self.dlperf / dph_total, 2),
            "total_flops": total_flops,
            "flops_per_dphtotal": round(total_flops / dph_total, 2),
            # vast.ai's default order; its formula is not published: here value per dollar, weighted by reliability.
            "score": round(self.dlperf / dph_total * self.reliability, 2),
            "verification": "verified" if self.verified else "unverified",
            "cpu_name": self.cpu_name,
            "cpu_cores": self.cpu_cores,
            "cpu_cores_effective": float(self.cpu_cores),  # the whole machine: every offer is one machine
            "cpu_ghz": CPU_GHZ[self.cpu_name],
            "cpu_ram": self.cpu_ram_mb,
            "cpu_arch": "amd64",
            "gpu_arch": "nvidia",
            "gpu_frac": 1.0,
            "gpu_display_active": False,
            "bw_nvlink": NVLINK_GB_S.get(self.gpu.name, 0.0) if self.num_gpus > 1 else 0.0,
            "pci_gen": pci_gen,
            "pcie_bw": 50.4 if pci_gen == 5.0 else 25.2,
            "has_avx": 1,
            "direct_port_count": 64 if self.hosting_type == 1 else 16,
            "static_ip": self.hosting_type == 1,
            "duration": MAX_RENTAL_S,
            "hosting_type": self.hosting_type,
            "cluster_id": None,  # no offer here belongs to a cluster
            **self.host_facts(),
        }

    def hidden(self) -> dict:
        """The listing plus what only the control API shows."""
        return {
            **self.listing(),
            "dies_after_s": self.dies_after_s,
            "effective_inet_up_mbps": self.effective_inet_up_mbps,
            "gone": self.gone,
            "rented_by": self.rented_by,
        }


def build_catalogue(seed: int, count: int = 300) -> list[Offer]:
    """A deterministic list of offers for this seed, in the order the search lists them when no order is asked."""
    rng = random.Random(seed)
    offer_ids = rng.sample(range(10_000_000, 40_000_000), count)
    machine_ids = rng.sample(range(10_000, 60_000), count)
    host_ids = rng.sample(range(10_000, 300_000), max(1, count // 3))  # a host often owns several machines
    weights = [model.weight for model in GPU_MODELS]
    return [
        _draw_offer(rng, offer_ids[i], machine_ids[i], rng.choice(host_ids), rng.choices(GPU_MODELS, weights)[0])
        for i in range(count)
    ]


def _draw_offer(rng: random.Random, offer_id: int, machine_id: int, host_id: int, gpu: GpuModel) -> Offer:
    cheap = rng.random() < 0.65
    num_gpus = rng.choice(gpu.gpu_counts)
    region = rng.choices((EUROPE, NORTH_AMERICA, ELSEWHERE), (45, 45, 10))[0]
    geolocation = rng.choice(region)

    low, high = gpu.cheap_usd_per_gpu_hour if cheap else gpu.premium_usd_per_gpu_hour
    per_gpu = rng.uniform(low, high)
    volume_discount = 1.0 if num_gpus == 1 else rng.uniform(0.95, 1.0)
    dph_base = round(per_gpu * num_gpus * volume_discount, 3)
    min_bid = round(dph_base * rng.uniform(0.35, 0.6), 3)

    if cheap:
        reliability = rng.uniform(0.90, 0.95) if rng.random() < 0.1 else rng.uniform(0.95, 0.989)
    else:
        reliability = rng.uniform(0.96, 0.99) if rng.random() < 0.2 else rng.uniform(0.99, 0.999)
    reliability = round(reliability, 4)
    reliability2 = round(min(0.9999, max(0.85, reliability + rng.uniform(-0.01, 0.005))), 4)

    driver_version, cuda_max_good = _draw_driver(rng, gpu, cheap)

    disk_bucket = rng.choice((50, 100, 150, 200, 250, 300, 500, 750, 1000) if cheap else (250, 500, 1000, 1500, 2000))
    disk_space = round(disk_bucket * rng.uniform(0.85, 1.0), 1)

    inet_down = _draw_bandwidth(rng, cheap)
    inet_up = round(max(20.0, inet_down * rng.uniform(0.3, 1.0)), 1)
    # Advertised bandwidth is local: some hosts push to a distant bucket at a fraction of it.
    local_only = rng.random() < (0.3 if cheap else 0.1)
    effective_up = round(inet_up * (rng.uniform(0.02, 0.3) if local_only else rng.uniform(0.7, 1.0)), 2)

    steep_traffic = cheap and rng.random() < 0.15
    inet_down_cost = round(rng.uniform(0.03, 0.10) if steep_traffic else rng.uniform(0.0, 0.01), 4)
    inet_up_cost = round(rng.uniform(0.03, 0.10) if steep_traffic else rng.uniform(0.0, 0.01), 4)
    storage_cost = round(rng.uniform(0.05, 0.30), 4)

    dies_after_s = round(rng.uniform(1800, 6 * 3600)) if cheap and rng.random() < 0.06 else None
    cpu_cores = min(256, num_gpus * rng.choice((8, 12, 16, 24, 32)))

    return Offer(
        id=offer_id,
        machine_id=machine_id,
        host_id=host_id,
        gpu=gpu,
        num_gpus=num_gpus,
        dph_base=dph_base,
        min_bid=min_bid,
        storage_cost=storage_cost,
        inet_up_cost=inet_up_cost,
        inet_down_cost=inet_down_cost,
        disk_space=disk_space,
        inet_up=inet_up,
        inet_down=inet_down,
        reliability=reliability,
        reliability2=reliability2,
        verified=rng.random() < (0.6 if cheap else 0.9),
        geolocation=geolocation,
        driver_version=driver_version,
        cuda_max_good=cuda_max_good,
        dlperf=round(gpu.dlperf * num_gpus * rng.uniform(0.9, 1.05), 1),
        cpu_name=rng.choice(CPU_NAMES),
        cpu_cores=cpu_cores,
        cpu_ram_mb=cpu_cores * rng.choice((4096, 8192)),
        disk_bw_mbps=round(rng.uniform(800, 7000), 1),
        hosting_type=0 if cheap and rng.random() < 0.5 else 1,
        dies_after_s=dies_after_s,
        effective_inet_up_mbps=effective_up,
    )


def _draw_driver(rng: random.Random, gpu: GpuModel, cheap: bool) -> tuple[str, float]:
    usable = [d for d in DRIVERS if int(d[0].split(".")[0]) >= gpu.min_driver_branch]
    # Cheap hosts lag on updates: weight old branches up there, new ones up on the pricier tier.
    weights = [(len(usable) - i) if cheap else (i + 1) for i in range(len(usable))]
    return rng.choices(usable, weights)[0]


def _draw_bandwidth(rng: random.Random, cheap: bool) -> float:
    bands = ((20, 100), (100, 500), (500, 1500), (1500, 5000))
    low, high = rng.choices(bands, (15, 35, 35, 15) if cheap else (3, 22, 45, 30))[0]
    return round(rng.uniform(low, high), 1)
