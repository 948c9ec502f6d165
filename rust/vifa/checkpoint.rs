//! The saved state of a [`super::Vifa`]: hyper-parameters, counters, parameters and Adam moments.

use super::fused::Kernel;
use super::params::{sqrt_noise, Moments, Params};
use super::update::LOG_NOISE_LIMIT;
use super::{Optimizer, Vifa, VifaKkStep};
use crate::error::{FaError, Result};
use crate::state::{expect_kind, Checkpoint, StateMap, StateReader, StateReal, StateValue, StateWriter};

const GROUPS: [&str; 3] = ["mean", "loadings", "log_noise"];

fn write_params<T: StateReal>(w: &mut StateWriter, prefix: &str, p: &Params<T>, d: usize, k: usize) {
    w.array(&format!("{prefix}{}", GROUPS[0]), vec![d], &p.c);
    w.array(&format!("{prefix}{}", GROUPS[1]), vec![d, k], &p.f);
    w.array(&format!("{prefix}{}", GROUPS[2]), vec![d], &p.beta);
}

fn read_params<T: StateReal>(r: &StateReader, prefix: &str, d: usize, k: usize) -> Result<Params<T>> {
    Ok(Params {
        c: r.array::<T>(&format!("{prefix}{}", GROUPS[0]), &[d])?,
        f: r.array::<T>(&format!("{prefix}{}", GROUPS[1]), &[d, k])?,
        beta: r.array::<T>(&format!("{prefix}{}", GROUPS[2]), &[d])?,
    })
}

impl<T: StateReal> Checkpoint for Vifa<T> {
    const KIND: &'static str = "VIFA";

    fn to_state(&self) -> StateMap {
        let (d, k) = (self.n_features, self.n_components);
        let mut w = StateWriter::new(Self::KIND);
        w.put("n_features", StateValue::Int(d as u64));
        self.kk_step.write_state(&mut w);
        write_params(&mut w, "", &self.params, d, k);
        if let Some(m) = &self.moments {
            write_params(&mut w, "adam_m_", &m.first, d, k);
            write_params(&mut w, "adam_v_", &m.second, d, k);
        }
        w.0
    }

    fn from_state(state: &StateMap) -> Result<Self> {
        expect_kind(state, Self::KIND)?;
        let r = StateReader(state);
        let bad = |e: FaError| FaError::InvalidState(e.to_string());
        let d = r.usize("n_features")?;
        let kk_step = VifaKkStep::read_state(&r, d)?;
        let k = kk_step.n_components;
        let moments = match kk_step.config.optimizer {
            Optimizer::Sgd => None,
            Optimizer::Adam => Some(Moments {
                first: read_params::<T>(&r, "adam_m_", d, k)?,
                second: read_params::<T>(&r, "adam_v_", d, k)?,
            }),
        };
        let mut model = Vifa {
            n_features: d,
            n_components: k,
            kk_step,
            sqrt_psi: Vec::new(),
            kernel: Kernel::choose(k),
            params: read_params(&r, "", d, k)?,
            moments,
        };
        if model
            .params
            .beta
            .iter()
            .any(|b| b.to_f64().is_nan() || b.to_f64().abs() > LOG_NOISE_LIMIT)
        {
            return Err(FaError::InvalidState(format!(
                "entry `log_noise` has |β| > {LOG_NOISE_LIMIT}"
            )));
        }
        model.sqrt_psi = sqrt_noise(&model.params.beta);
        model.kk_step.m_inv = Some(model.recompute_m_inv().map_err(bad)?);
        Ok(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vifa::{LearningRates, VifaConfig, VifaInit};

    fn adam_model(d: usize, seed: u64) -> Vifa<f32> {
        let f = crate::init::orthonormal_loadings(d, 2, seed).expect("init");
        let cfg = VifaConfig {
            prior_precision: 0.1,
            lr: LearningRates {
                mean: 1e-2,
                loadings: 1e-3,
                log_noise: 1e-2,
            },
            optimizer: Optimizer::Adam,
            n_grad_samples: 2,
            clip_grad_norm: Some(10.0),
        };
        Vifa::new(
            d,
            2,
            VifaInit {
                loadings: f.view(),
                mean: None,
                noise_variance: None,
            },
            seed,
            cfg,
        )
        .expect("new")
    }

    /// Quadratic NLL ½‖θ − 1‖²: gradient θ − 1.
    fn cycle(vi: &mut Vifa<f32>) {
        while vi.n_pending() < vi.config().n_grad_samples {
            vi.sample().expect("sample");
        }
        let (h, z) = vi.pending_noise();
        let thetas = h.dot(&vi.loadings().t()) + vi.mean() + &(z * vi.noise_variance().mapv(f64::sqrt));
        vi.step((thetas - 1.0).view()).expect("step");
    }

    #[test]
    fn resume_from_state_is_bit_identical() {
        let d = 300;
        let mut a = adam_model(d, 11);
        for _ in 0..3 {
            cycle(&mut a);
        }
        a.sample().expect("sample"); // one draw pending in the checkpoint
        let mut b = Vifa::<f32>::from_state(&a.to_state()).expect("restore");
        assert_eq!(a, b);
        for _ in 0..3 {
            cycle(&mut a);
            cycle(&mut b);
        }
        assert_eq!(a, b);
        assert!(
            Vifa::<f64>::from_state(&a.to_state()).is_err(),
            "dtype mismatch must be rejected"
        );
        let mut broken = a.to_state();
        broken.insert("n_pending".into(), StateValue::Int(5));
        assert!(Vifa::<f32>::from_state(&broken).is_err());
        let mut broken = a.to_state();
        broken.remove("adam_v_loadings");
        assert!(Vifa::<f32>::from_state(&broken).is_err());
    }
}
