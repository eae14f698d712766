"""The official RunPod Python SDK's pod functions against the RunPod stand-in the product's own client is tested on."""

from fleet.providers.records import RentRequest
from fleet.providers.runpod import RunPodClient
from tests.fleet.runpod_server import NO_CAPACITY, RUNPOD_KEY

IMAGE = "runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04"


def test_it_lists_gpu_types_and_one_type_with_its_lowest_price(runpod_sdk):
    everything, h200 = runpod_sdk.calls([("get_gpus", {}), ("get_gpu", {"gpu_id": "NVIDIA H200", "gpu_quantity": 2})])
    assert {"NVIDIA H200", "NVIDIA B200"} <= {g["id"] for g in everything["value"]}
    assert set(everything["value"][0]) == {"id", "displayName", "memoryInGb"}  # only what the query selected
    h200 = h200["value"]
    assert (h200["id"], h200["memoryInGb"], h200["maxGpuCount"]) == ("NVIDIA H200", 141, 8)
    assert h200["lowestPrice"] == {"minimumBidPrice": 1.99, "uninterruptablePrice": 3.59}


def test_it_creates_gets_stops_resumes_and_terminates_a_pod(runpod_sdk, runpod_fake):
    created = runpod_sdk.value("create_pod", name="sdk-pod", image_name=IMAGE, gpu_type_id="NVIDIA H200",
                               cloud_type="SECURE", ports="8000/tcp,22/tcp", env={"RUN": "3"},
                               container_disk_in_gb=50)
    pod_id = created["id"]
    assert created["imageName"] == IMAGE and created["env"] == ["RUN=3"] and created["machine"]["podHostId"]
    pod = runpod_fake.pods[pod_id]
    assert (pod.cloud_type, pod.cost_per_hr, pod.container_disk_gb) == ("SECURE", 3.99, 50)

    first, second, listing = runpod_sdk.calls([("get_pod", {"pod_id": pod_id}), ("get_pod", {"pod_id": pod_id}),
                                               ("get_pods", {})])
    assert first["value"]["desiredStatus"] == "CREATED" and first["value"]["runtime"] is None
    running = second["value"]
    assert running["desiredStatus"] == "RUNNING" and running["machine"] == {"gpuDisplayName": "H200"}
    public = {p["privatePort"] for p in running["runtime"]["ports"] if p["isIpPublic"]}
    assert public == {8000, 22}
    assert [p["id"] for p in listing["value"]] == [pod_id]

    stopped, resumed, terminated, after = runpod_sdk.calls([
        ("stop_pod", {"pod_id": pod_id}), ("resume_pod", {"pod_id": pod_id, "gpu_count": 1}),
        ("terminate_pod", {"pod_id": pod_id}), ("get_pod", {"pod_id": pod_id})])
    assert stopped["value"] == {"id": pod_id, "desiredStatus": "EXITED"}
    assert resumed["value"]["desiredStatus"] == "RUNNING"
    assert terminated == {"value": None} and after == {"value": None}
    assert runpod_fake.pods == {}


def test_it_lets_any_cloud_take_the_cheaper_one(runpod_sdk, runpod_fake):
    pod_id = runpod_sdk.value("create_pod", name="any", image_name=IMAGE, gpu_type_id="NVIDIA H200")["id"]
    assert (runpod_fake.pods[pod_id].cloud_type, runpod_fake.pods[pod_id].cost_per_hr) == ("COMMUNITY", 3.59)


def test_it_raises_the_sdk_errors(runpod_sdk, runpod_fake):
    runpod_fake.capacity_gone("NVIDIA B200")
    wrong_key = runpod_sdk.calls([("get_pods", {})], api_key="not-the-key")[0]
    assert wrong_key == {"error": "AuthenticationError", "message": "Unauthorized request, please check your API key."}
    unknown_gpu, no_capacity, unknown_pod, stop_unknown = runpod_sdk.calls([
        ("create_pod", {"name": "x", "image_name": IMAGE, "gpu_type_id": "NVIDIA NOPE"}),
        ("create_pod", {"name": "x", "image_name": IMAGE, "gpu_type_id": "NVIDIA B200", "cloud_type": "SECURE"}),
        ("terminate_pod", {"pod_id": "nope"}),
        ("stop_pod", {"pod_id": "nope"}),
    ])
    assert unknown_gpu["error"] == "ValueError" and "No GPU found" in unknown_gpu["message"]
    assert no_capacity == {"error": "QueryError", "message": NO_CAPACITY}
    assert unknown_pod == stop_unknown == {"error": "QueryError", "message": "Pod not found"}
    assert runpod_fake.pods == {}


def test_it_sees_the_pod_the_product_rented_and_the_product_sees_the_sdk_stop(runpod_sdk, runpod_fake):
    client = RunPodClient(runpod_fake.base_url, RUNPOD_KEY, max_retries=1, timeout_s=5)
    try:
        pod_id = client.rent(RentRequest(offer_id="NVIDIA H200:SECURE:1", image=IMAGE, disk_gb=250, label="run-5",
                                         env={"RUN": "5"}))
        listing = runpod_sdk.value("get_pods")
        assert [(p["id"], p["name"], p["containerDiskInGb"], p["env"]) for p in listing] == [
            (pod_id, "run-5", 250, ["RUN=5"])]
        runpod_sdk.value("stop_pod", pod_id=pod_id)
        assert client.get_instance(pod_id).status == "exited"  # the product reads EXITED so, whoever stopped it
    finally:
        client.close()
