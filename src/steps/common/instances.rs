//! Instances of an OpenCV model shared by the workers that run one step.
//!
//! A `cv::dnn::Net`, a HOG descriptor or a cascade classifier may move between threads but not
//! be used by two at once (a forward pass writes into the net), so a step keeps a small stock of
//! them. Threads: none of its own. A worker running the step takes an idle instance, or makes a
//! new one when every instance is busy, runs, and puts it back. The stock therefore never grows
//! beyond the number of threads that ran the step at the same moment (the pool's workers plus
//! the executor's coordinator), and an instance is never made per frame. The mutex guards only
//! the idle list, for one push or pop; it is never held during inference. An instance whose
//! user panicked is dropped rather than put back.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::steps::StepError;

type Make<T> = Box<dyn Fn() -> Result<T, StepError> + Send + Sync>;

pub(in crate::steps) struct Instances<T> {
    idle: Mutex<Vec<T>>,
    make: Make<T>,
    /// Instances made so far (the first one included). Written with `Relaxed`: it is a count for
    /// logs and tests, nothing is ordered by it.
    made: AtomicUsize,
}

impl<T: Send> Instances<T> {
    /// A stock holding `first` (made while the pipeline was loaded, which proved the model
    /// loads); `make` makes the others, lazily.
    pub(in crate::steps) fn new<E: Into<StepError>>(
        first: T,
        make: impl Fn() -> Result<T, E> + Send + Sync + 'static,
    ) -> Self {
        Self {
            idle: Mutex::new(vec![first]),
            make: Box::new(move || make().map_err(Into::into)),
            made: AtomicUsize::new(1),
        }
    }

    /// Runs `f` with an instance of its own.
    pub(in crate::steps) fn with<R>(
        &self,
        f: impl FnOnce(&mut T) -> Result<R, StepError>,
    ) -> Result<R, StepError> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut instance = match idle {
            Some(instance) => instance,
            None => {
                let instance = (self.make)()?;
                self.made.fetch_add(1, Ordering::Relaxed);
                instance
            }
        };
        let result = f(&mut instance);
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(instance);
        result
    }

    /// How many instances were made so far.
    #[cfg(test)]
    pub(in crate::steps) fn made(&self) -> usize {
        self.made.load(Ordering::Relaxed)
    }
}

impl<T> fmt::Debug for Instances<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instances")
            .field("made", &self.made.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::*;

    #[test]
    fn one_instance_serves_calls_one_after_another() {
        let stock = Instances::new(0_u32, || Ok::<_, StepError>(0));
        for _ in 0..10 {
            stock
                .with(|n| {
                    *n += 1;
                    Ok(())
                })
                .unwrap();
        }
        assert_eq!(stock.made(), 1);
        assert_eq!(stock.with(|n| Ok(*n)).unwrap(), 10);
    }

    #[test]
    fn calls_at_the_same_time_get_instances_of_their_own() {
        let stock = Arc::new(Instances::new(0_u32, || Ok::<_, StepError>(0)));
        let barrier = Arc::new(Barrier::new(3));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (stock, barrier) = (stock.clone(), barrier.clone());
                std::thread::spawn(move || {
                    stock
                        .with(|n| {
                            // All three hold an instance here at once.
                            barrier.wait();
                            *n += 1;
                            Ok(())
                        })
                        .unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(stock.made(), 3);
        // Each was used once and all went back to the stock.
        assert_eq!(*stock.idle.lock().unwrap(), vec![1, 1, 1]);
    }
}
