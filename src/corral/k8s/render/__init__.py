"""`corral k8s render`: turn one `corral.yaml` into Kubernetes manifests where Kubernetes schedules and
Corral runs the lifecycle. `config` reads and checks the file, `budgets` derives every probe, drain and
rollout number from it, `commands` builds the command lines the pods run, `manifests` the objects, and
`output` writes them as YAML.
"""
