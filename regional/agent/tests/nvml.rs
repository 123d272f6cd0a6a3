//! NVML discovery on a machine with NVIDIA GPUs: each GPU's index, UUID,
//! model, memory and PCI bus id, and the node a real agent registers from
//! them. Skipped, saying so, where NVML does not load (no driver: CI).

use gangway_agent::identity::{gpu_type_of_model, nvml_gpus, real_node, Declared};

#[test]
fn nvml_finds_this_machines_gpus_in_pci_bus_order() {
    let gpus = match nvml_gpus() {
        Ok(g) if !g.is_empty() => g,
        Ok(_) => {
            eprintln!("SKIPPED: NVML loads but finds no GPU on this machine");
            return;
        }
        Err(e) => {
            eprintln!("SKIPPED: no NVML on this machine ({e}): the NVML path needs a GPU host");
            return;
        }
    };
    for (i, g) in gpus.iter().enumerate() {
        assert_eq!(g.index as usize, i, "{g:?}");
        assert!(
            g.uuid.starts_with("GPU-") || g.uuid.starts_with("MIG-"),
            "{g:?}"
        );
        assert!(g.model.as_deref().is_some_and(|m| !m.is_empty()), "{g:?}");
        assert!(g.memory_mib.is_some_and(|m| m > 0), "{g:?}");
        assert!(
            g.pci_bus_id.as_deref().is_some_and(|p| p.contains(':')),
            "{g:?}"
        );
        eprintln!("GPU {i}: {g:?}");
    }
    // NVML's index order is PCI bus order, the order CUDA uses under
    // CUDA_DEVICE_ORDER=PCI_BUS_ID.
    let buses: Vec<String> = gpus
        .iter()
        .map(|g| g.pci_bus_id.clone().unwrap().to_ascii_lowercase())
        .collect();
    let mut sorted = buses.clone();
    sorted.sort();
    assert_eq!(buses, sorted);
    // A real agent registers them as they are, typed from the model.
    let none = Declared {
        gpus: None,
        gpu_type: None,
    };
    let node = real_node("this-host", "127.0.0.1", Ok(gpus.clone()), &none).unwrap();
    assert_eq!(node.gpus, gpus);
    assert_eq!(
        node.gpu_type,
        gpu_type_of_model(gpus[0].model.as_deref().unwrap())
    );
}
