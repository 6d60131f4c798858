"""
Settings for the hosts of the `workstations` group (inventory/spark.py): RTX 50xx boxes
beside the Sparks. Only what differs from group_data/all.py goes here.
"""

# x86_64 with a compute capability 12.0 (sm_120) GPU; hardware() checks the box against it.
hardware_profile = "rtx50"
